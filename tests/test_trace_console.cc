// fastdecode-trace's pieces (the Chrome Trace Event file, the live view's arithmetic, packed
// spans) and the spans a running node sends to a subscriber.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "actors/system.h"
#include "pipeline_fixture.h"
#include "actors/trace_packed.h"
#include "caf/all.hpp"
#include "examples/common/trace_record.h"
#include "examples/common/trace_view.h"
#include "runtime/error.h"
#include "tests/test_models.h"

namespace {

fd::trace_event span(const std::string& track, const std::string& kind, const std::string& name,
                     int64_t ts, int64_t dur, std::vector<std::string> names = {},
                     std::vector<double> values = {}, const std::string& node = "") {
  fd::trace_event e;
  e.track = track;
  e.node = node;
  e.kind = kind;
  e.name = name;
  e.ph = 'X';
  e.ts_us = ts;
  e.dur_us = dur;
  e.arg_names = std::move(names);
  e.arg_values = std::move(values);
  return e;
}

fd::trace_event counter(const std::string& track, const std::string& kind,
                        const std::string& name, int64_t ts, std::vector<std::string> names,
                        std::vector<double> values, const std::string& node = "") {
  fd::trace_event e = span(track, kind, name, ts, 0, std::move(names), std::move(values), node);
  e.ph = 'C';
  return e;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string temp_path() {
  return "/tmp/fd-trace-test-" + std::to_string(::getpid()) + ".json";
}

}  // namespace

TEST_CASE("json_number writes integers exactly and never NaN", "[trace_console]") {
  CHECK(fd::json_number(3) == "3");
  CHECK(fd::json_number(-12) == "-12");
  CHECK(fd::json_number(4294967296.0) == "4294967296");
  CHECK(fd::json_number(0.25) == "0.25");
  CHECK(fd::json_number(1.0 / 3) == "0.333333333");
  CHECK(fd::json_number(std::nan("")) == "null");
  CHECK(fd::json_number(1e300 * 1e300) == "null");
}

TEST_CASE("the recording is Chrome Trace Event JSON with a process per node", "[trace_console]") {
  const std::string path = temp_path();
  {
    fd::ChromeTraceWriter w(path);
    w.add(span("mini_batch-0", "mini_batch", "step", 1000, 250, {"rows", "s_ms"}, {4, 0.5}));
    w.add(span("shard 0", "shard", "R", 1100, 40, {}, {}, "cpu-1"));
    w.add(counter("shard 0", "shard", "kv", 2000, {"used_pages", "free_pages"}, {3, 61},
                  "cpu-1"));
    w.add(span("mini_batch-0", "mini_batch", "quote\"d", 1300, 5, {}, {}, "local"));
    fd::trace_event odd = span("mini_batch-0", "mini_batch", "begin", 1400, 0);
    odd.ph = 'B';  // not a phase the console emits: skipped
    w.add(odd);
    CHECK(w.events() == 4);
  }  // the destructor ends the JSON
  const std::string json = slurp(path);
  std::remove(path.c_str());
  const std::string want =
      "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,"
      "\"args\":{\"name\":\"node local\"}},\n"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,"
      "\"args\":{\"name\":\"node local / mini_batch-0\"}},\n"
      "{\"name\":\"step\",\"cat\":\"mini_batch\",\"ph\":\"X\",\"ts\":1000,\"pid\":1,\"tid\":1,"
      "\"dur\":250,\"args\":{\"rows\":4,\"s_ms\":0.5}},\n"
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":2,\"tid\":0,"
      "\"args\":{\"name\":\"node cpu-1\"}},\n"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":2,\"tid\":2,"
      "\"args\":{\"name\":\"node cpu-1 / shard 0\"}},\n"
      "{\"name\":\"R\",\"cat\":\"shard\",\"ph\":\"X\",\"ts\":1100,\"pid\":2,\"tid\":2,\"dur\":40,"
      "\"args\":{}},\n"
      "{\"name\":\"shard 0 kv\",\"cat\":\"shard\",\"ph\":\"C\",\"ts\":2000,\"pid\":2,"
      "\"tid\":2,\"args\":{\"used_pages\":3,\"free_pages\":61}},\n"
      "{\"name\":\"quote\\\"d\",\"cat\":\"mini_batch\",\"ph\":\"X\",\"ts\":1300,\"pid\":1,"
      "\"tid\":1,"
      "\"dur\":5,\"args\":{}}\n"
      "]}\n";
  CHECK(json == want);
}

TEST_CASE("the same track on two nodes gets two processes and two threads", "[trace_console]") {
  const std::string path = temp_path();
  {
    fd::ChromeTraceWriter w(path);
    w.add(span("shard 0", "shard", "R", 10, 1, {}, {}, "a"));
    w.add(span("shard 0", "shard", "R", 20, 1, {}, {}, "b"));
    w.add(span("shard 0", "shard", "R", 30, 1, {}, {}, "a"));
  }
  const std::string json = slurp(path);
  std::remove(path.c_str());
  INFO(json);
  CHECK(json.find("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,"
                  "\"args\":{\"name\":\"node a\"}}") != std::string::npos);
  CHECK(json.find("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":2,\"tid\":0,"
                  "\"args\":{\"name\":\"node b\"}}") != std::string::npos);
  CHECK(json.find("\"args\":{\"name\":\"node b / shard 0\"}") != std::string::npos);
  CHECK(json.find("\"ts\":20,\"pid\":2,\"tid\":2,") != std::string::npos);
  CHECK(json.find("\"ts\":30,\"pid\":1,\"tid\":1,") != std::string::npos);
}

TEST_CASE("an empty recording is still valid JSON", "[trace_console]") {
  const std::string path = temp_path();
  {
    fd::ChromeTraceWriter w(path);
    w.close();
    w.close();  // harmless
  }
  const std::string json = slurp(path);
  std::remove(path.c_str());
  CHECK(json == "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n]}\n");
  CHECK_THROWS_AS(fd::ChromeTraceWriter("/nonexistent-dir/x.json"), fd::Error);
}

TEST_CASE("the live view computes rates, busy fractions and argument means", "[trace_console]") {
  fd::TraceView v;
  // 10 steps of 50 ms in a 2 s window: 5 steps/s, busy 25 %; 4 tokens each: 20 tokens/s.
  for (int i = 0; i < 10; ++i)
    v.add(span("mini_batch-0", "mini_batch", "step", i * 100000, 50000, {"rows", "tokens"},
               {double(2 + 2 * (i % 2)), 4}));
  // 4 R spans of 250 ms: 2/s, busy 50 %.
  for (int i = 0; i < 4; ++i) v.add(span("shard cpu-1/shard-0", "shard", "R", i, 250000));
  v.add(counter("scheduler", "scheduler", "load", 5, {"queued", "live"}, {1, 7}));
  v.add(counter("scheduler", "scheduler", "load", 6, {"queued", "live"}, {0, 8}));
  const std::string text = v.render(2.0, "title");
  INFO(text);
  CHECK(text.rfind("title", 0) == 0);
  CHECK(text.find("tokens/s 20.0   steps/s 5.0") != std::string::npos);
  CHECK(text.find("step: 5.0/s  50.00 ms each  busy 25%  idle 75%  rows 3  tokens 4") !=
        std::string::npos);
  // 1000 ms of R over 10 steps.
  CHECK(text.find("R: 2.0/s  250.00 ms each  busy 50%  idle 50%  100.00 ms/step") !=
        std::string::npos);
  CHECK(text.find("load:  queued 0  live 8") != std::string::npos);
  // Kinds appear in pipeline order.
  CHECK(text.find("\nscheduler\n") < text.find("\nmini_batch\n"));
  CHECK(text.find("\nmini_batch\n") < text.find("\nshard\n"));

  // The next window starts empty; counters keep their latest values.
  const std::string next = v.render(1.0, "title");
  CHECK(next.find("tokens/s 0.0") != std::string::npos);
  CHECK(next.find("step: idle") != std::string::npos);
  CHECK(next.find("load:  queued 0  live 8") != std::string::npos);
  CHECK(v.events() == 16);
}

TEST_CASE("without a tokens argument each sequence of a step counts one token",
          "[trace_console]") {
  fd::TraceView v;
  for (int i = 0; i < 6; ++i)
    v.add(span("mini_batch-1", "mini_batch", "step", i, 1000, {"rows", "seqs"}, {9, 3}));
  const std::string text = v.render(0.5, "t");  // 18 tokens in 0.5 s
  INFO(text);
  CHECK(text.find("tokens/s 36.0   steps/s 12.0") != std::string::npos);
}

TEST_CASE("the live view shows the node of every actor in its own column", "[trace_console]") {
  fd::TraceView v;
  v.add(span("mini_batch-0", "mini_batch", "step", 0, 1000, {"seqs"}, {2}));
  v.add(span("shard 0", "shard", "R", 0, 100, {}, {}, "cpu-a"));
  v.add(span("shard 0", "shard", "R", 0, 300, {}, {}, "cpu-bb"));
  const std::string text = v.render(1.0, "t");
  INFO(text);
  // Node column 6 wide ("cpu-bb"), actor column 12 ("mini_batch-0"), two spaces after each.
  CHECK(text.find("\n  node    actor\n") != std::string::npos);
  CHECK(text.find("\n  local   mini_batch-0  step: ") != std::string::npos);
  CHECK(text.find("\n  cpu-a   shard 0       R: 1.0/s  0.10 ms each") != std::string::npos);
  CHECK(text.find("\n  cpu-bb  shard 0       R: 1.0/s  0.30 ms each") != std::string::npos);
}

TEST_CASE("packed spans unpack into events on their actors' nodes", "[trace_console]") {
  std::vector<fd::PackedSpan> spans(4);
  spans[0].kind = uint8_t(fd::SpanKind::step);
  spans[0].actor = 1;
  spans[0].ts_us = 1000;
  spans[0].dur_us = 500;
  // s_ms, r_ms and comm_ms (arguments 3 to 5) travel in microseconds.
  for (int i = 0; i < fd::kSpanArgs; ++i) spans[0].args[i] = (i >= 3 && i <= 5 ? 1000 : 1) * (i + 1);
  spans[1].kind = uint8_t(fd::SpanKind::s);
  spans[1].actor = 1;
  spans[1].ts_us = 1010;
  spans[1].dur_us = 20;
  spans[1].args[0] = 12;
  spans[2].kind = uint8_t(fd::SpanKind::r);
  spans[2].actor = 4;
  spans[2].ts_us = 1040;
  spans[2].dur_us = 30;
  spans[2].args[0] = 3;
  spans[2].args[1] = 200;  // µs: rtt_ms 0.2
  spans[3].kind = 77;  // unknown: skipped
  fd::trace_packed p;
  p.spans = fd::to_bytes(spans.data(), spans.size());
  p.spans.insert(p.spans.end(), 5, 'x');  // a partial record: skipped
  p.shard_ids = {4};
  p.shard_nodes = {"cpu-a"};
  std::map<int32_t, std::string> nodes;
  std::vector<fd::trace_event> ev;
  fd::unpack_spans(p, nodes, ev);
  REQUIRE(ev.size() == 3);
  CHECK(ev[0].track == "mini_batch-1");
  CHECK(ev[0].kind == "mini_batch");
  CHECK(ev[0].name == "step");
  CHECK(ev[0].node == "local");
  CHECK(ev[0].ph == 'X');
  CHECK(ev[0].ts_us == 1000);
  CHECK(ev[0].dur_us == 500);
  CHECK(ev[0].arg_names == std::vector<std::string>{"rows", "seqs", "micro_batches", "s_ms",
                                                    "r_ms", "comm_ms", "kv_tokens"});
  CHECK(ev[0].arg_values == std::vector<double>{1, 2, 3, 4, 5, 6, 7});
  CHECK(ev[1].track == "gpu_stream-1");
  CHECK(ev[1].kind == "gpu_stream");
  CHECK(ev[1].name == "S");
  CHECK(ev[1].arg_names == std::vector<std::string>{"rows"});
  CHECK(ev[1].arg_values == std::vector<double>{12});
  CHECK(ev[2].track == "shard 4");
  CHECK(ev[2].kind == "shard");
  CHECK(ev[2].name == "R");
  CHECK(ev[2].node == "cpu-a");
  CHECK(ev[2].arg_names == std::vector<std::string>{"layer", "rtt_ms"});
  CHECK(ev[2].arg_values == std::vector<double>{3, 0.2});

  // A later message without the table: shard 4 keeps its node, an unknown shard is local.
  fd::trace_packed q;
  spans[3].kind = uint8_t(fd::SpanKind::r);
  spans[3].actor = 9;
  q.spans = fd::to_bytes(spans.data() + 2, 2);
  ev.clear();
  fd::unpack_spans(q, nodes, ev);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].node == "cpu-a");
  CHECK(ev[1].track == "shard 9");
  CHECK(ev[1].node == "local");
}

namespace {

struct Received {
  std::mutex mu;
  size_t packed = 0;  // trace_packed messages
  std::vector<fd::trace_event> spans;
};

fd::trace_sink::behavior_type span_collector(fd::trace_sink::pointer,
                                             std::shared_ptr<Received> out) {
  auto nodes = std::make_shared<std::map<int32_t, std::string>>();
  return {[](fd::trace_batch&) {},
          [out, nodes](fd::trace_packed& p) {
            std::lock_guard<std::mutex> lock(out->mu);
            ++out->packed;
            fd::unpack_spans(p, *nodes, out->spans);
          }};
}

}  // namespace

TEST_CASE("a subscriber gets every step's spans, batched, from a running node",
          "[trace_console]") {
  const fd::ModelConfig c =
      test_models::config(3, 64, 4, 2, 128, 300, 128);
  auto model = std::make_shared<const fd::Model>(fd::make_random_model(c, 5));
  auto got = std::make_shared<Received>();
  std::vector<fd::gen_result> results;
  const int max_new = 12;
  double elapsed_ms = 0;
  {
    TestSystem actors;
    caf::actor_system& sys = actors.sys;
    fd::LocalOptions opt = test_node_options(2, size_t(16) << 20);
    fd::LocalNode node = fd::start_local_node(sys, model, opt);
    auto sink = sys.spawn(span_collector, got);
    caf::scoped_actor self{sys};
    self->send(node.scheduler, fd::subscribe_atom::value, sink);
    // The stats round trip returns after the subscription was handled, so every step traces.
    self->request(node.scheduler, std::chrono::seconds(30), fd::stats_atom::value)
        .receive([](fd::sched_stats&) {}, [](caf::error&) { FAIL("no stats"); });
    std::vector<fd::gen_request> reqs;
    for (int i = 0; i < 6; ++i) {
      fd::gen_request r;
      r.prompt = {1, 10 + i, 20 + 2 * i};
      r.max_new = max_new;
      reqs.push_back(r);
    }
    const auto t0 = std::chrono::steady_clock::now();
    results = fd::generate(sys, node.scheduler, reqs, std::chrono::minutes(2));
    // The last spans leave within kTraceFlush of being recorded.
    std::this_thread::sleep_for(3 * fd::kTraceFlush);
    elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count();
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
    fd::stop_local_node(node);
  }
  std::lock_guard<std::mutex> lock(got->mu);
  // Each sequence of a step samples one token; a final EOS is sampled but not returned.
  double tokens = 0;
  for (auto& r : results) {
    REQUIRE(r.error == "");
    tokens += double(r.tokens.size()) + (int(r.tokens.size()) < max_new ? 1 : 0);
  }
  size_t steps = 0, s_spans = 0;
  double seqs = 0;
  std::map<std::string, size_t> r_per_track;
  for (const fd::trace_event& e : got->spans) {
    CHECK(e.node == "local");
    CHECK(e.ph == 'X');
    if (e.name == "step") {
      ++steps;
      REQUIRE(e.arg_names.size() == 7);
      seqs += e.arg_values[1];
    } else if (e.name == "S") {
      ++s_spans;
    } else {
      REQUIRE(e.name == "R");
      ++r_per_track[e.track];
      CHECK(e.arg_values[0] >= 0);
      CHECK(e.arg_values[0] < c.n_layers);
    }
  }
  CHECK(seqs == tokens);
  CHECK(steps >= size_t(max_new));
  // One S call to start a step and one after each layer's attention.
  CHECK(s_spans == steps * size_t(c.n_layers + 1));
  CHECK(r_per_track.size() == 2);
  CHECK(r_per_track.count("shard 0") == 1);
  CHECK(r_per_track.count("shard 1") == 1);
  // Batched: each of the two mini-batches sends at most once per kTraceFlush (plus its last).
  const double flush_ms = std::chrono::duration<double, std::milli>(fd::kTraceFlush).count();
  CHECK(double(got->packed) <= 2 * (elapsed_ms / flush_ms + 1));
}

TEST_CASE("the live view counts packed spans as it counts their events", "[trace_console]") {
  std::vector<fd::PackedSpan> spans;
  for (int i = 0; i < 40; ++i) {
    fd::PackedSpan s;
    s.kind = uint8_t(i % 3);
    s.actor = i % 3 == 2 ? i % 2 : 0;  // R spans alternate between shards 0 and 1
    s.ts_us = 1000 * i;
    s.dur_us = 100 + 7 * i;
    for (int a = 0; a < fd::kSpanArgs; ++a) s.args[a] = (i + 1) * (a + 2);
    spans.push_back(s);
  }
  fd::trace_packed p;
  p.spans = fd::to_bytes(spans.data(), spans.size());
  p.shard_ids = {0, 1};
  p.shard_nodes = {"cpu-a", "cpu-b"};
  std::map<int32_t, std::string> nodes;
  std::vector<fd::trace_event> events;
  fd::unpack_spans(p, nodes, events);
  fd::TraceView by_event, by_packed;
  for (auto& e : events) by_event.add(e);
  by_packed.add_spans(p, nodes);
  const std::string a = by_event.render(2.0, "t"), b = by_packed.render(2.0, "t");
  INFO(a);
  CHECK(a == b);
  CHECK(by_packed.events() == 40);
  CHECK(a.find("\n  cpu-b  shard 1") != std::string::npos);
}
