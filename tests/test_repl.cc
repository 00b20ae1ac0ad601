// fastdecode-repl's pieces: slash commands, statistics, the vocabulary sent by the gatekeeper,
// and streaming/cancelling a generation against an in-process deployment of stories260K.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "actors/gatekeeper.h"
#include "actors/system.h"
#include "pipeline_fixture.h"
#include "caf/all.hpp"
#include "examples/common/repl_commands.h"
#include "examples/common/repl_stream.h"
#include "kernels/ops.h"
#include "runtime/model.h"
#include "tests/test_models.h"

namespace {

// An in-memory FILE whose text can be read at any time after fflush.
struct MemFile {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  ~MemFile() {
    std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, size);
  }
};

// A random model with a long context: its answers run long enough to be cancelled midway.
std::shared_ptr<const fd::Model> long_context_model() {
  const fd::ModelConfig c =
      test_models::config(2, 64, 4, 2, 128, 300, 4096);
  return std::make_shared<const fd::Model>(fd::make_random_model(c, 11));
}

struct LocalDeployment {
  std::shared_ptr<const fd::Model> model;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  fd::LocalNode node;
  explicit LocalDeployment(std::shared_ptr<const fd::Model> m =
                               std::make_shared<const fd::Model>(fd::load_model(test_models::stories_path())))
      : model(std::move(m)) {
    fd::kernels::set_gemm_threads(1);
    fd::configure_caf(cfg, 2);
    sys = std::make_unique<caf::actor_system>(cfg);
    fd::LocalOptions opt = test_node_options(2);
    node = fd::start_local_node(*sys, model, opt);
  }

  fd::sched_stats sched() {
    caf::scoped_actor self{*sys};
    fd::sched_stats out;
    self->request(node.scheduler, std::chrono::seconds(10), fd::stats_atom::value)
        .receive([&](fd::sched_stats& s) { out = s; }, [](caf::error&) { FAIL("no stats"); });
    return out;
  }
  uint64_t shard_sequences() {
    caf::scoped_actor self{*sys};
    uint64_t n = 0;
    for (auto& s : node.shards)
      self->request(s, std::chrono::seconds(10), fd::stats_atom::value)
          .receive([&](fd::shard_stats& st) { n += st.sequences; },
                   [](caf::error&) { FAIL("no shard stats"); });
    return n;
  }
};

// The text the REPL prints for a completion: the prompt, then each token after its predecessor.
std::string expected_text(const fd::Vocab& v, const std::string& prompt,
                          const std::vector<int32_t>& prompt_ids,
                          const std::vector<int32_t>& tokens) {
  fd::Tokenizer tok(v);
  std::string out = prompt;
  int32_t prev = prompt_ids.back();
  for (int32_t id : tokens) {
    out += fd::terminal_safe(tok.piece(prev, id));
    prev = id;
  }
  return out;
}

fd::ReplSettings greedy(int32_t max_new) {
  fd::ReplSettings s;
  s.max_new = max_new;
  s.sampling.temperature = 0;
  return s;
}

}  // namespace

TEST_CASE("slash commands change the settings or say what is wrong", "[repl]") {
  fd::ReplSettings s;
  s.sampling.temperature = 0.8f;
  CHECK(fd::is_command("  /temp 0"));
  CHECK_FALSE(fd::is_command("Once upon a /time"));

  auto r = fd::run_command("/temp 0", s);
  CHECK(r.action == fd::ReplAction::none);
  CHECK(s.sampling.temperature == 0.0f);
  CHECK(r.message.find("greedy") != std::string::npos);

  r = fd::run_command("/temp -1", s);
  CHECK(s.sampling.temperature == 0.0f);
  CHECK(r.message.find(">= 0") != std::string::npos);
  r = fd::run_command("/temp abc", s);
  CHECK(r.message.find("'abc'") != std::string::npos);

  fd::run_command("/topk 7", s);
  CHECK(s.sampling.top_k == 7);
  fd::run_command("/topp 0.5", s);
  CHECK(s.sampling.top_p == 0.5f);
  r = fd::run_command("/topp 1.5", s);
  CHECK(s.sampling.top_p == 0.5f);
  CHECK(r.message.find("(0, 1]") != std::string::npos);
  fd::run_command("/seed 12345678901", s);
  CHECK(s.sampling.seed == 12345678901ull);
  r = fd::run_command("/seed -3", s);
  CHECK(s.sampling.seed == 12345678901ull);
  fd::run_command("/max 17", s);
  CHECK(s.max_new == 17);
  r = fd::run_command("/max 0", s);
  CHECK(s.max_new == 17);
  r = fd::run_command("/max", s);
  CHECK(r.message.find("needs a value") != std::string::npos);
  r = fd::run_command("/temp 1 2", s);
  CHECK(r.message.find("at most one value") != std::string::npos);

  CHECK(fd::run_command("/quit", s).action == fd::ReplAction::quit);
  CHECK(fd::run_command("/stats", s).action == fd::ReplAction::stats);
  CHECK(fd::run_command("/help", s).action == fd::ReplAction::help);
  r = fd::run_command("/frobnicate", s);
  CHECK(r.action == fd::ReplAction::none);
  CHECK(r.message.find("unknown command /frobnicate") != std::string::npos);
}

TEST_CASE("model output reaches the terminal without control characters", "[repl]") {
  CHECK(fd::terminal_safe("a\tb\nc") == "a\tb\nc");
  CHECK(fd::terminal_safe("x\ry\x1b[2Jz\x7f") == "x\xEF\xBF\xBDy\xEF\xBF\xBD[2Jz\xEF\xBF\xBD");
  // UTF-8 stays.
  CHECK(fd::terminal_safe("caf\xC3\xA9 \xE2\x96\x81") == "caf\xC3\xA9 \xE2\x96\x81");
}

TEST_CASE("stats give tokens/s and time to first token of the last answer", "[repl]") {
  CHECK(fd::format_stats(nullptr) == "no answer yet");
  fd::AnswerStats a;
  a.tokens = 5;
  a.client_ms = 1000;
  a.client_ttft_ms = 600;
  const std::string s = fd::format_stats(&a);
  CHECK(s.find("5 tokens in 1.000 s") != std::string::npos);
  CHECK(s.find(": 5.0 tokens/s") != std::string::npos);          // 5 / 1 s
  CHECK(s.find("(10.0 tokens/s after the first)") != std::string::npos);  // 4 / 0.4 s
  CHECK(s.find("time to first token 600.0 ms") != std::string::npos);
}

TEST_CASE("the gatekeeper hands clients the model's vocabulary", "[repl]") {
  auto model = std::make_shared<const fd::Model>(fd::load_model(test_models::stories_path()));
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt;
  opt.log = false;
  fd::GpuNode node = fd::start_gpu_node(sys, model, opt);
  fd::GatekeeperConfig gc;
  gc.token = "s3cret";
  gc.run_id = 1;
  gc.model = model->cfg;
  gc.vocab = model->vocab;
  auto gate = fd::spawn_gatekeeper(sys, gc, node.scheduler);
  caf::scoped_actor self{sys};
  std::string err;
  self->request(gate, std::chrono::seconds(5), fd::vocab_atom::value,
                fd::client_hello{"wrong", fd::kProtocolVersion})
      .receive([](fd::vocab_msg&) {}, [&](caf::error& e) { err = sys.render(e); });
  CHECK(err.find("wrong cluster secret") != std::string::npos);

  fd::Vocab got;
  self->request(gate, std::chrono::seconds(5), fd::vocab_atom::value,
                fd::client_hello{"s3cret", fd::kProtocolVersion})
      .receive([&](fd::vocab_msg& m) { got = fd::from_vocab_msg(m); },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  const fd::Vocab& want = model->vocab;
  REQUIRE(got.size() == want.size());
  CHECK(got.pieces == want.pieces);
  CHECK(got.scores == want.scores);
  CHECK(got.types == want.types);
  CHECK(got.bos == want.bos);
  CHECK(got.eos == want.eos);
  CHECK(got.add_space_prefix == want.add_space_prefix);
  const std::string text = "Once upon a time, Lily saw a big dog.";
  CHECK(fd::Tokenizer(got).encode(text, true) == fd::Tokenizer(want).encode(text, true));

  fd::vocab_msg bad = fd::to_vocab_msg(want);
  bad.scores.pop_back();
  CHECK_THROWS_AS(fd::from_vocab_msg(bad), fd::Error);
  caf::anon_send_exit(gate, caf::exit_reason::user_shutdown);
  fd::stop_gpu_node(node);
}

TEST_CASE("the REPL client prints tokens as they arrive, the same as a batch run", "[repl]") {
  LocalDeployment d;
  const std::string prompt = "Once upon a time";
  fd::gen_request ref;
  ref.prompt = fd::Tokenizer(d.model->vocab).encode(prompt, true);
  ref.max_new = 40;
  auto want = fd::generate(*d.sys, d.node.scheduler, {ref}, std::chrono::minutes(2));
  REQUIRE(want[0].error.empty());
  const std::string want_text = expected_text(d.model->vocab, prompt, ref.prompt, want[0].tokens);

  fd::ReplClient client(*d.sys, d.node.scheduler, fd::gatekeeper_actor{}, d.model->vocab,
                        "local", std::chrono::seconds(60));
  MemFile out;
  std::vector<size_t> sizes;  // output length each time the client polls
  auto st = client.generate(prompt, greedy(40), out.f, [&] {
    sizes.push_back(out.text().size());
    return false;
  });
  CHECK(st.error.empty());
  CHECK_FALSE(st.cancelled);
  CHECK(out.text() == want_text + "\n");
  CHECK(st.tokens == want[0].tokens.size() - (want[0].tokens.back() == d.model->vocab.eos));
  // The text grew while the answer was still being generated, one token per message.
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const auto partial = std::count_if(sizes.begin(), sizes.end(), [&](size_t n) {
    return n > prompt.size() && n < want_text.size();
  });
  CHECK(partial >= 10);
  CHECK(st.client_ttft_ms > 0);
  CHECK(st.client_ttft_ms <= st.client_ms);
}

TEST_CASE("cancelling a generation frees its sequence, the next prompt works", "[repl]") {
  LocalDeployment d(long_context_model());
  fd::ReplClient client(*d.sys, d.node.scheduler, fd::gatekeeper_actor{}, d.model->vocab,
                        "local", std::chrono::seconds(60));
  const std::string prompt = "abc";
  const int32_t max_new = 4000;
  MemFile out;
  int polls_after_output = 0;
  auto st = client.generate(prompt, greedy(max_new), out.f, [&] {
    if (out.text().size() > prompt.size()) ++polls_after_output;
    return polls_after_output >= 3;
  });
  INFO("tokens " << st.tokens << ", error '" << st.error << "'");
  CHECK(st.cancelled);
  CHECK(st.error.empty());
  CHECK(st.tokens >= 3);
  CHECK(st.tokens < static_cast<size_t>(max_new));
  CHECK(d.sched().live == 0);
  // The shards drop the KV-cache on a message of their own: give it a moment to arrive.
  for (int i = 0; i < 100 && d.shard_sequences() != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(d.shard_sequences() == 0);

  // The next prompt runs to its end and matches a batch run.
  fd::gen_request ref;
  ref.prompt = fd::Tokenizer(d.model->vocab).encode(prompt, true);
  ref.max_new = 12;
  auto want = fd::generate(*d.sys, d.node.scheduler, {ref}, std::chrono::minutes(2));
  REQUIRE(want[0].error.empty());
  MemFile out2;
  auto st2 = client.generate(prompt, greedy(12), out2.f, [] { return false; });
  CHECK(st2.error.empty());
  CHECK_FALSE(st2.cancelled);
  CHECK(out2.text() == expected_text(d.model->vocab, prompt, ref.prompt, want[0].tokens) + "\n");
}

TEST_CASE("the REPL client reports a node that went away", "[repl]") {
  LocalDeployment d;
  fd::ReplClient client(*d.sys, d.node.scheduler, fd::gatekeeper_actor{}, d.model->vocab,
                        "127.0.0.1:9", std::chrono::seconds(60));
  caf::anon_send_exit(d.node.scheduler, caf::exit_reason::kill);
  MemFile out;
  try {
    client.generate("Once upon a time", greedy(10), out.f, [] { return false; });
    FAIL("no error");
  } catch (const fd::ConnectionLost& e) {
    CHECK(std::string(e.what()) == "connection to 127.0.0.1:9 lost");
  }
}
