// fastdecode-trace's pieces: the Chrome Trace Event file and the live view's arithmetic.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "examples/common/trace_record.h"
#include "examples/common/trace_view.h"
#include "runtime/error.h"

namespace {

fd::trace_event span(const std::string& track, const std::string& kind, const std::string& name,
                     int64_t ts, int64_t dur, std::vector<std::string> names = {},
                     std::vector<double> values = {}) {
  fd::trace_event e;
  e.track = track;
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
                        std::vector<double> values) {
  fd::trace_event e = span(track, kind, name, ts, 0, std::move(names), std::move(values));
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

TEST_CASE("the recording is Chrome Trace Event JSON with named tracks", "[trace_console]") {
  const std::string path = temp_path();
  {
    fd::ChromeTraceWriter w(path);
    w.add(span("mini_batch-0", "mini_batch", "step", 1000, 250, {"rows", "s_ms"}, {4, 0.5}));
    w.add(span("shard cpu-1/shard-0", "shard", "R", 1100, 40));
    w.add(counter("shard cpu-1/shard-0", "shard", "kv", 2000, {"used_pages", "free_pages"},
                  {3, 61}));
    w.add(span("mini_batch-0", "mini_batch", "quote\"d", 1300, 5));
    CHECK(w.events() == 4);
  }  // the destructor ends the JSON
  const std::string json = slurp(path);
  std::remove(path.c_str());
  const std::string want =
      "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,"
      "\"args\":{\"name\":\"mini_batch\"}},\n"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,"
      "\"args\":{\"name\":\"mini_batch-0\"}},\n"
      "{\"name\":\"step\",\"cat\":\"mini_batch\",\"ph\":\"X\",\"ts\":1000,\"pid\":1,\"tid\":1,"
      "\"dur\":250,\"args\":{\"rows\":4,\"s_ms\":0.5}},\n"
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":2,\"tid\":0,"
      "\"args\":{\"name\":\"shard\"}},\n"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":2,\"tid\":2,"
      "\"args\":{\"name\":\"shard cpu-1/shard-0\"}},\n"
      "{\"name\":\"R\",\"cat\":\"shard\",\"ph\":\"X\",\"ts\":1100,\"pid\":2,\"tid\":2,\"dur\":40,"
      "\"args\":{}},\n"
      "{\"name\":\"shard cpu-1/shard-0 kv\",\"cat\":\"shard\",\"ph\":\"C\",\"ts\":2000,\"pid\":2,"
      "\"tid\":2,\"args\":{\"used_pages\":3,\"free_pages\":61}},\n"
      "{\"name\":\"quote\\\"d\",\"cat\":\"mini_batch\",\"ph\":\"X\",\"ts\":1300,\"pid\":1,"
      "\"tid\":1,"
      "\"dur\":5,\"args\":{}}\n"
      "]}\n";
  CHECK(json == want);
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
