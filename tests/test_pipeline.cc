// The actor pipeline against the plain fp32 reference forward pass (tests/reference_model.h).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "pipeline_fixture.h"
#include "reference_model.h"
#include "runtime/tokenizer.h"
#include "tests/test_models.h"

namespace {

const char* kStoryPrompts[] = {
    "Once upon a time",
    "Tom had a red ball",
    "The cat sat",
    "One day, a little girl named Lily went to the park with her mom. She saw a big tree",
    "Sam",
    "The sun was shining and the birds were singing. Max the dog ran to the",
    "She",
};

std::vector<std::vector<int32_t>> story_prompts(const fd::Model& m, int n) {
  fd::Tokenizer tok(m.vocab);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::string text = kStoryPrompts[i % 7];
    for (int r = 0; r < i / 7; ++r) text += " and";  // different lengths for repeats
    out.push_back(tok.encode(text, true));
  }
  return out;
}

std::vector<std::vector<int32_t>> random_prompts(const fd::Model& m, int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p{m.vocab.bos};
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int t = 0; t < len; ++t) p.push_back(3 + static_cast<int32_t>(rng() % (m.cfg.vocab - 3)));
    out.push_back(p);
  }
  return out;
}

// Greedy reference continuation and the logits of every token it picks (final EOS included).
void reference_run(ReferenceModel& ref, const std::vector<int32_t>& prompt, int n, int eos,
                   std::vector<int32_t>& tokens, std::vector<float>& logits) {
  ref.reset(0);
  std::vector<float> l;
  for (int32_t t : prompt) l = ref.forward(0, t);
  for (int i = 0; i < n; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    logits.insert(logits.end(), l.begin(), l.end());
    if (next == eos) break;
    tokens.push_back(next);
    if (static_cast<int>(prompt.size() + tokens.size()) >= ref.model().cfg.ctx) break;
    l = ref.forward(0, next);
  }
}

void compare_with_reference(std::shared_ptr<const fd::Model> model,
                            const std::vector<std::vector<int32_t>>& prompts, int n_gen,
                            int shards, int pipeline = 2, int block_tokens = 0) {
  std::vector<fd::gen_request> reqs;
  for (const auto& p : prompts) {
    fd::gen_request r;
    r.prompt = p;
    r.max_new = n_gen;
    r.temperature = 0;
    r.want_logits = true;
    reqs.push_back(r);
  }
  auto results = run_pipeline(model, reqs, shards, fd::kernels::KvDtype::f16, pipeline, block_tokens);
  REQUIRE(results.size() == prompts.size());
  ReferenceModel ref(*model);
  const int vocab = model->cfg.vocab;
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i << " of " << prompts.size() << ", " << shards << " shards");
    REQUIRE(results[i].error == "");
    std::vector<int32_t> want;
    std::vector<float> want_logits;
    reference_run(ref, prompts[i], n_gen, model->vocab.eos, want, want_logits);
    CHECK(results[i].tokens == want);
    REQUIRE(results[i].logits.size() == want_logits.size() * sizeof(float));
    const float* got = fd::as<float>(results[i].logits);
    // Both sides hold K/V in fp16 and differ only in fp32 summation order (GEMM blocking,
    // online softmax): ~1e-6 relative per op over a few layers; 1e-3 of the logit range is ample
    // and still far below any real divergence.
    for (size_t row = 0; row * vocab < want_logits.size(); ++row) {
      float range = 0, diff = 0;
      for (int t = 0; t < vocab; ++t) {
        range = std::max(range, std::fabs(want_logits[row * vocab + t]));
        diff = std::max(diff, std::fabs(want_logits[row * vocab + t] - got[row * vocab + t]));
      }
      INFO("token " << row);
      CHECK(diff <= 1e-3f * std::max(1.0f, range));
    }
  }
}

std::shared_ptr<const fd::Model> stories() {
  return std::make_shared<const fd::Model>(
      fd::load_model(std::string(FD_SHARED_DIR) + "/models/stories260K.gguf"));
}

std::shared_ptr<const fd::Model> random_gqa128() {
  const fd::ModelConfig c =
      test_models::config(2, 512, 4, 1, 768, 512, 128);  // 4:1 GQA
  return std::make_shared<const fd::Model>(fd::make_random_model(c, 7));
}

// stories260K's greedy 40-token continuation of "Once upon a time" through the actor pipeline,
// with the KV-cache in format kv.
std::string stories_greedy_text(fd::kernels::KvDtype kv) {
  auto model = stories();
  fd::Tokenizer tok(model->vocab);
  fd::gen_request r;
  r.prompt = tok.encode("Once upon a time", true);
  r.max_new = 40;
  r.temperature = 0;
  auto res = run_pipeline(model, {r}, 2, kv);
  REQUIRE(res[0].error == "");
  return "Once upon a time" + tok.decode(res[0].tokens);
}

constexpr const char* kGolden =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park. One day, she saw a big, red ball.";

}  // namespace

TEST_CASE("golden greedy text of stories260K through the actor pipeline", "[pipeline]") {
  CHECK(stories_greedy_text(fd::kernels::KvDtype::f16).substr(0, std::strlen(kGolden)) == kGolden);
}

TEST_CASE("stories260K keeps its golden greedy text with an int8 KV-cache", "[pipeline]") {
  CHECK(stories_greedy_text(fd::kernels::KvDtype::q8).substr(0, std::strlen(kGolden)) == kGolden);
}

TEST_CASE("pipeline matches the reference on stories260K", "[pipeline]") {
  auto model = stories();
  for (int n : {1, 5, 33})
    for (int shards : {1, 3}) compare_with_reference(model, story_prompts(*model, n), 12, shards);
}

TEST_CASE("one to four mini-batches in flight match the reference on stories260K", "[pipeline]") {
  auto model = stories();
  for (int pipeline : {1, 3, 4}) compare_with_reference(model, story_prompts(*model, 9), 10, 2, pipeline);
}

TEST_CASE("KV pages of 1 to 128 tokens match the reference on stories260K", "[pipeline]") {
  auto model = stories();
  for (int block : {1, 7, 128}) {
    INFO(block << " tokens per page");
    compare_with_reference(model, story_prompts(*model, 5), 12, 2, 2, block);
  }
}

TEST_CASE("pipeline matches the reference on a head_dim 128, 4:1 GQA random model", "[pipeline]") {
  auto model = random_gqa128();
  for (int n : {1, 5, 33})
    for (int shards : {1, 3})
      compare_with_reference(model, random_prompts(*model, n, 100 + n), 8, shards);
}

TEST_CASE("sampling gives the same text per seed whatever the shards and the batch", "[pipeline]") {
  auto model = stories();
  fd::Tokenizer tok(model->vocab);
  auto make = [&](const std::string& text, uint64_t seed) {
    fd::gen_request r;
    r.prompt = tok.encode(text, true);
    r.max_new = 24;
    r.temperature = 0.9f;
    r.top_k = 40;
    r.top_p = 0.95f;
    r.seed = seed;
    return r;
  };
  const auto a = make("Once upon a time", 11);
  const auto b = make("The dog", 12);
  const auto c = make("Lily and Tom were", 13);
  auto alone = run_pipeline(model, {a}, 1);
  auto mixed = run_pipeline(model, {c, a, b}, 3);
  auto other_seed = run_pipeline(model, {make("Once upon a time", 99)}, 2);
  REQUIRE(alone[0].error == "");
  REQUIRE(mixed[1].error == "");
  CHECK(alone[0].tokens == mixed[1].tokens);
  CHECK(alone[0].tokens != other_seed[0].tokens);
}

TEST_CASE("a bad request fails alone and the others complete", "[pipeline]") {
  auto model = stories();
  fd::Tokenizer tok(model->vocab);
  fd::gen_request good;
  good.prompt = tok.encode("Once upon a time", true);
  good.max_new = 8;
  fd::gen_request too_long = good;
  too_long.prompt.assign(model->cfg.ctx + 5, 100);
  fd::gen_request bad_token = good;
  bad_token.prompt.push_back(model->cfg.vocab + 3);
  auto res = run_pipeline(model, {good, too_long, bad_token, good}, 2);
  CHECK(res[0].error == "");
  CHECK(res[0].tokens.size() == 8);
  CHECK(res[1].error.find("context") != std::string::npos);
  CHECK(res[2].error.find("vocabulary") != std::string::npos);
  CHECK(res[3].tokens == res[0].tokens);
}

TEST_CASE("a sequence leaves the batch at its length limit and frees its KV-cache", "[pipeline]") {
  auto model = random_gqa128();
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt = test_node_options(2);
  fd::LocalNode node = fd::start_local_node(sys, model, opt);
  fd::gen_request r;
  r.prompt = {model->vocab.bos, 10, 11, 12};
  r.max_new = 1000;  // far beyond the context: stops at ctx
  auto res = fd::generate(sys, node.scheduler, {r, r}, std::chrono::minutes(5));
  for (auto& x : res) {
    REQUIRE(x.error == "");
    // EOS may end it earlier; otherwise prompt + generated fill the context exactly.
    CHECK(x.tokens.size() + r.prompt.size() <= static_cast<size_t>(model->cfg.ctx));
  }
  caf::scoped_actor self{sys};
  for (auto& shard : node.shards)
    self->request(shard, std::chrono::seconds(10), fd::stats_atom::value)
        .receive([](fd::shard_stats& s) {
                   CHECK(s.sequences == 0);
                   CHECK(s.used_pages == 0);
                 },
                 [](caf::error&) { FAIL("no stats from a shard"); });
  fd::stop_local_node(node);
}

TEST_CASE("a KV-cache smaller than one page is refused at start and nothing is left running",
          "[pipeline]") {
  auto model = random_gqa128();
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt = test_node_options(2, 1024);
  CHECK_THROWS_WITH(fd::start_local_node(sys, model, opt), Catch::Contains("smaller than one page") &&
                                                               Catch::Contains("--kv-memory"));
  // Leaving the scope destroys `sys`, which waits for every actor: it returns only because the
  // scheduler and the GPU streams that had started were stopped.
}

TEST_CASE("a node stops its actors when it ends or is replaced and a moved node keeps serving",
          "[pipeline]") {
  auto model = random_gqa128();
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt = test_node_options(1);
  fd::gen_request r;
  r.prompt = {model->vocab.bos, 10, 11, 12};
  r.max_new = 4;
  const auto serves = [&](const fd::scheduler_actor& s) {
    auto res = fd::generate(sys, s, {r}, std::chrono::minutes(2));
    return res[0].error.empty() && res[0].tokens.size() == 4;
  };
  fd::LocalNode kept;
  {
    fd::LocalNode a = fd::start_local_node(sys, model, opt);
    fd::LocalNode b = std::move(a);
    CHECK_FALSE(a.scheduler);
    CHECK(a.shards.empty());
    kept = std::move(b);
  }
  REQUIRE(kept.scheduler);
  CHECK(serves(kept.scheduler));
  const fd::scheduler_actor replaced = kept.scheduler;
  kept = fd::start_local_node(sys, model, opt);
  CHECK(serves(kept.scheduler));
  caf::scoped_actor self{sys};
  bool gone = false;
  self->request(replaced, std::chrono::seconds(10), fd::stats_atom::value)
      .receive([](fd::sched_stats&) {}, [&](caf::error&) { gone = true; });
  CHECK(gone);
  fd::LocalNode unstopped = fd::start_local_node(sys, model, opt);
  CHECK(serves(unstopped.scheduler));
  // No stop_local_node: leaving the scope ends the nodes, then `sys`, which waits for every actor
  // and returns only because the nodes stopped theirs.
}
