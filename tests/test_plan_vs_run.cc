// The performance model's tokens/s against a real run of the same configuration: simulated
// S-part from the shipped A10 profile, one real shard, two mini-batches, sls.
#include <catch2/catch.hpp>
#include <string>

#include "examples/common/bench_plan.h"

namespace {

std::string source_dir() {  // CMake compiles tests by absolute path: <src>/tests/this file
  const std::string f = __FILE__;
  return f.substr(0, f.rfind("/tests/"));
}

}  // namespace

TEST_CASE("plan: predicted tokens/s of a small run within a factor 2 of the real run", "[plan-run]") {
  fd::PlanRunConfig cfg;
  cfg.shape.n_layers = 2;
  cfg.shape.dim = 256;
  cfg.shape.n_heads = 4;
  cfg.shape.n_kv_heads = 4;
  cfg.shape.head_dim = 64;
  cfg.shape.ff = 256;
  cfg.shape.vocab = 320;
  cfg.sim_profile = source_dir() + "/examples/profiles/a10-llama7b.txt";
  cfg.schedule.kind = fd::ScheduleKind::sls;
  cfg.schedule.batch = 8;
  cfg.schedule.seq_len = 24;
  cfg.schedule.interval = 4;
  cfg.pipeline = 2;
  cfg.shards = 1;
  cfg.requests = 32;
  cfg.min_time = 0.1;
  const fd::PlanVsRun r = fd::plan_vs_run(cfg);
  REQUIRE(r.run.results.size() == 32);
  for (const auto& g : r.run.results) CHECK(g.tokens.size() == 24u);
  // The model replays exactly the steps the run makes: every request's 24 tokens.
  CHECK(r.predicted.tokens == 32 * 24);
  CHECK(r.run.generated == 32 * 24);
  REQUIRE(r.measured_tokens_per_s > 0);
  INFO("predicted " << r.predicted.tokens_per_s << " tokens/s, measured " << r.measured_tokens_per_s);
  // Most of this run is the simulated device's sleep, which load cannot shorten or stretch much;
  // the hand-overs the model adds were measured under the same load just before. A factor 2
  // leaves room for a loaded 2-core machine preempting the run's threads for part of it (the
  // benchmark, not this test, holds the 15 % target).
  CHECK(r.ratio > 0.5);
  CHECK(r.ratio < 2.0);
}
