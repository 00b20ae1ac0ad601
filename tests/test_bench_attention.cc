// `fastdecode-bench attention --json` on a tiny grid: one line per case with the fields the issue
// names, figures that agree with each other, and the page order it was asked for. No speed is
// asserted here; the benchmark prints its figures.
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "examples/common/bench_attention.h"
#include "runtime/error.h"
#include "tests/bench_output.h"

namespace {

std::vector<std::string> run_bench(std::vector<std::string> args) {
  return fd::test::run_bench_mode(fd::bench_attention_main, "attention", std::move(args));
}

using fd::test::json_field;
using fd::test::json_string;

// A tiny grid (ctx 130, head_dim 64, 2 kv heads, one thread, KV hot in cache, no timed minimum)
// with the given options added.
std::vector<std::string> tiny_grid(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--json",     "--ctx", "130",        "--head-dim", "64",          "--threads", "1",
                                   "--kv-heads", "2",     "--min-time", "0",          "--cold-size", "0",
                                   "--stream-size", "4MiB"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_bench(args);
}

}  // namespace

TEST_CASE("bench attention prints every case with consistent figures and its page order", "[bench]") {
  for (const char* pages : {"whole", "grown"}) {
    INFO("--pages " << pages);
    const auto lines = tiny_grid({"--batch", "3", "--gqa", "1,4", "--kv-dtype", "f16,q8,q4", "--pages", pages});
    REQUIRE(lines.size() == 6);
    for (const auto& line : lines) {
      INFO(line);
      CHECK(json_string(line, "pages") == pages);
      CHECK(!json_string(line, "kv_dtype").empty());
      CHECK(json_field(line, "head_dim") == 64);
      CHECK(json_field(line, "ctx") == 130);
      CHECK(json_field(line, "batch") == 3);
      CHECK(json_field(line, "threads") == 1);
      const double gbps = json_field(line, "gbps"), stream = json_field(line, "stream_gbps");
      CHECK(gbps > 0);
      CHECK(stream > 0);
      CHECK(json_field(line, "ratio") == Approx(gbps / stream).epsilon(1e-4));
      // tokens/s is the batch over the seconds of one call, GB/s its KV bytes over the same seconds.
      const double kv_bytes = json_field(line, "kv_mib") * (1 << 20);
      CHECK(json_field(line, "tokens_per_s") == Approx(3 / (kv_bytes / (gbps * 1e9))).epsilon(1e-4));
    }
    // A shape's dtypes are measured together, against one stream bandwidth read between their rounds.
    for (size_t i = 0; i < lines.size(); i += 3) {
      INFO(lines[i]);
      CHECK(json_field(lines[i], "gqa") == json_field(lines[i + 2], "gqa"));
      CHECK(json_string(lines[i], "kv_dtype") == "f16");
      CHECK(json_string(lines[i + 1], "kv_dtype") == "int8");
      CHECK(json_string(lines[i + 2], "kv_dtype") == "int4");
      CHECK(json_field(lines[i], "stream_gbps") == json_field(lines[i + 1], "stream_gbps"));
      CHECK(json_field(lines[i], "stream_gbps") == json_field(lines[i + 2], "stream_gbps"));
    }
  }
}

TEST_CASE("bench attention lays its stores out as --kv-layout says, and names a bad layout", "[bench]") {
  for (const char* layout : {"apart", "side"}) {
    INFO("--kv-layout " << layout);
    const auto lines = tiny_grid({"--batch", "2", "--gqa", "2", "--kv-dtype", "f16,q8", "--kv-layout", layout});
    REQUIRE(lines.size() == 2);
    for (const auto& line : lines) {
      INFO(line);
      CHECK(json_string(line, "kv_layout") == layout);
      CHECK(json_field(line, "gbps") > 0);
    }
  }
  // auto: each dtype's own choice; q4 keeps its heads apart on every CPU.
  const auto lines = tiny_grid({"--batch", "2", "--gqa", "1", "--kv-dtype", "q4"});
  REQUIRE(lines.size() == 1);
  CHECK(json_string(lines[0], "kv_layout") == "apart");
  try {
    run_bench({"--json", "--kv-layout", "diagonal"});
    FAIL("no error");
  } catch (const fd::Error& e) {
    CHECK(std::string(e.what()).find("--kv-layout must be auto, apart or side, not 'diagonal'") != std::string::npos);
  }
}

TEST_CASE("bench attention rejects an unknown page order by name", "[bench]") {
  try {
    run_bench({"--json", "--pages", "sideways"});
    FAIL("no error");
  } catch (const fd::Error& e) {
    CHECK(std::string(e.what()).find("--pages must be whole or grown, not 'sideways'") != std::string::npos);
  }
}

TEST_CASE("bench attention reads the stream a bounded number of times per shape, however short its calls", "[bench]") {
  // Calls of tens of microseconds, hot in cache: a read after every round would make thousands.
  const auto lines = run_bench({"--json", "--ctx", "130", "--batch", "1", "--head-dim", "64", "--gqa", "1",
                                "--kv-dtype", "f16,q4", "--threads", "1", "--kv-heads", "2", "--min-time", "0.1",
                                "--cold-size", "0", "--stream-size", "16MiB"});
  REQUIRE(lines.size() == 2);
  for (const auto& line : lines) {
    INFO(line);
    // One read per eighth of --min-time that every case was timed for, however long a pass ran.
    CHECK(json_field(line, "stream_reads") == 8);
  }
  const auto none = run_bench({"--json", "--ctx", "130", "--batch", "1", "--head-dim", "64", "--gqa", "1",
                               "--threads", "1", "--kv-heads", "2", "--min-time", "0", "--cold-size", "0",
                               "--stream-size", "4MiB"});
  REQUIRE(none.size() == 1);
  CHECK(json_field(none[0], "stream_reads") == 3);
}
