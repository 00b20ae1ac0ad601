// `fastdecode-bench prefill --json` on a tiny case: one line per case with figures that agree with
// each other, and one clear error for a bad flag. No speed is asserted here.
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "examples/common/bench_prefill.h"
#include "tests/bench_output.h"

namespace {

std::vector<std::string> run_prefill(std::vector<std::string> args) {
  return fd::test::run_bench_mode(fd::bench_prefill_main, "prefill", std::move(args));
}

using fd::test::json_field;

}  // namespace

TEST_CASE("bench prefill prints every case with consistent figures", "[bench]") {
  const auto lines = run_prefill({"--json", "--prompt", "40", "--decode", "0,3", "--ctx", "70", "--head-dim", "64",
                                  "--gqa", "4", "--kv-heads", "1", "--kv-dtype", "f16,q4", "--threads", "2",
                                  "--min-time", "0"});
  REQUIRE(lines.size() == 4);
  for (const auto& line : lines) {
    INFO(line);
    CHECK(json_field(line, "prompt") == 40);
    CHECK(json_field(line, "ctx") == 70);
    CHECK(json_field(line, "threads") == 2);
    CHECK(json_field(line, "kv_heads") == 1);
    const double ms = json_field(line, "ms"), ms1 = json_field(line, "ms_1thread");
    CHECK(ms > 0);
    CHECK(ms1 > 0);
    CHECK(json_field(line, "speedup") == Approx(ms1 / ms).epsilon(1e-3));
    // 4 * head_dim flops per query head and visible key: 4 * 64 * 4 * (40 * 41 / 2) per call.
    CHECK(json_field(line, "gflops") == Approx(4.0 * 64 * 4 * 820 / (ms * 1e-3) / 1e9).epsilon(1e-3));
  }
  CHECK(json_field(lines[0], "decode") == 0);
  CHECK(json_field(lines[1], "decode") == 3);
}

TEST_CASE("bench prefill names a bad flag", "[bench]") {
  CHECK_THROWS_WITH(run_prefill({"--prompt", "0"}), Catch::Contains("--prompt"));
  CHECK_THROWS_WITH(run_prefill({"--kv-dtype", "f8"}), Catch::Contains("f8"));
}
