#include <catch2/catch.hpp>

#include "runtime/error.h"
#include "runtime/perf_model.h"

namespace {

// T(B) = 1 ms + 1 µs·B (two entries, extrapolated beyond 1001); N = 10 layers, S = 1000,
// R = 1e-7 s per token, 4 workers per node holding 1e6 tokens.
fd::PlanInput synthetic() {
  fd::PlanInput in;
  in.n_layers = 10;
  in.seq_len = 1000;
  in.r_seconds = 1e-7;
  in.kv_tokens_per_node = 1e6;
  in.workers_per_node = 4;
  in.spart = fd::parse_sim_profile("1 0.001001\n1001 0.002001\n", "synthetic");
  in.max_batch = 4000;
  return in;
}

}  // namespace

TEST_CASE("plan: latency limit picks the largest B with 2·N·S·T(B) <= L", "[plan]") {
  auto in = synthetic();
  in.latency_limit = 30;  // T(B) <= 30 / (2·10·1000) = 1.5 ms  ->  B <= 500
  const auto p = fd::recommend_plan(in);
  REQUIRE(p.feasible);
  const auto& r = p.best;
  CHECK(r.batch == 500);
  CHECK(r.t_spart == Approx(0.0015));
  CHECK(r.efficiency == Approx(500 / 0.0015));
  CHECK(r.p_balance == Approx(500 * 1000 * 1e-7 / (2 * 0.0015)));  // 16.67
  CHECK(r.p_memory == 1);  // 250000 tokens over 250000 per worker
  CHECK(r.workers == 17);
  CHECK(r.nodes == 5);
  CHECK(r.t_rpart == Approx(0.05 / 34));
  CHECK(r.step_seconds == Approx(10 * (0.0015 + 0.05 / 34)));
  CHECK(r.tokens_per_second == Approx(500 / (10 * (0.0015 + 0.05 / 34))));  // 16832
  CHECK(r.seq_seconds <= 30);
  CHECK(r.load_limit == 255000);  // 17 workers · 1.5 ms / 1e-7 s
  CHECK_FALSE(fd::evaluate_plan(in, 501).meets_latency);
}

TEST_CASE("plan: without a limit, the smallest B within the gain of the best B/T(B)", "[plan]") {
  auto in = synthetic();
  // E(B) = B / (0.001 + 1e-6·B) rises to E(4000) = 800000; 90 % of it needs
  // B >= 720 / 0.28 = 2571.4.
  const auto p = fd::recommend_plan(in);
  CHECK(p.best.batch == 2572);
  in.gain = 0.5;  // B >= 400 / 0.6 = 666.7
  CHECK(fd::recommend_plan(in).best.batch == 667);
  in.gain = 0;
  CHECK(fd::recommend_plan(in).best.batch == 4000);
}

TEST_CASE("plan: memory adds workers; an impossible limit is reported", "[plan]") {
  auto in = synthetic();
  in.latency_limit = 30;
  in.kv_tokens_per_node = 20000;  // 5000 per worker: B·S/2 = 250000 needs 50 workers
  const auto r = fd::recommend_plan(in).best;
  CHECK(r.batch == 500);
  CHECK(r.p_memory == 50);
  CHECK(r.workers == 50);
  CHECK(r.nodes == 13);
  CHECK(r.step_seconds == Approx(10 * (0.0015 + 0.0005)));
  CHECK(r.tokens_per_second == Approx(25000));

  in.latency_limit = 0.01;  // T(1) = 1.001 ms needs L >= 20.02 s
  const auto p = fd::recommend_plan(in);
  CHECK_FALSE(p.feasible);
  CHECK(p.best.batch == 1);

  in.r_seconds = 0;
  CHECK_THROWS_AS(fd::recommend_plan(in), fd::Error);
  auto zero = synthetic();
  zero.spart = fd::parse_sim_profile("1 0\n", "z");
  CHECK_THROWS_AS(fd::evaluate_plan(zero, 1), fd::Error);
}

TEST_CASE("plan: KV bytes per token", "[plan]") {
  fd::ModelConfig c;
  c.n_layers = 32;
  c.n_kv_heads = 32;
  c.head_dim = 128;
  CHECK(fd::kv_bytes_per_token(c) == 2.0 * 32 * 4096 * 2);  // 512 KiB for Llama-7B
}
