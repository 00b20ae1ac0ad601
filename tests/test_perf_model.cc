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

TEST_CASE("plan: memory adds workers, an impossible limit is reported", "[plan]") {
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

namespace {

// N layers, T(B) = 1 ms for every B, R seconds per cached token, no hand-over costs.
fd::RunCosts flat_costs(double r_seconds) {
  fd::RunCosts c;
  c.spart = fd::parse_sim_profile("1 0.001\n", "flat");
  c.r_seconds = r_seconds;
  return c;
}

fd::RunShape one_token_requests(int n_layers, int pipeline, int workers, int batch, int n, int steps) {
  fd::RunShape r;
  r.n_layers = n_layers;
  r.pipeline = pipeline;
  r.workers = workers;
  r.schedule.kind = fd::ScheduleKind::large_batch;
  r.schedule.batch = batch;
  r.schedule.seq_len = steps;
  r.schedule.interval = 1;
  r.requests.assign(static_cast<size_t>(n), fd::SeqShape{0, steps});
  return r;
}

}  // namespace

TEST_CASE("run prediction: one mini-batch pays S-part and R-part in turn", "[plan]") {
  // 2 sequences of 3 steps, 2 layers: W after the steps is 2, 4, 6 tokens, and a step costs
  // N·(T + W·R) = 2·(1 ms + W·0.1 ms): 2.4 + 2.8 + 3.2 = 8.4 ms for 6 tokens.
  const auto p = fd::predict_run(one_token_requests(2, 1, 1, 2, 2, 3), flat_costs(1e-4));
  CHECK(p.tokens == 6);
  CHECK(p.steps == 3);
  CHECK(p.seconds == Approx(0.0084));
  CHECK(p.tokens_per_s == Approx(6 / 0.0084));
  CHECK(p.s_busy == Approx(0.006 / 0.0084));
  CHECK(p.r_busy == Approx(0.0024 / 0.0084));
  CHECK(p.t_layer_s == Approx(0.001));
  CHECK(p.r_layer_s == Approx(0.0004));  // mean W = 4 tokens
}

TEST_CASE("run prediction: two mini-batches overlap S and R on one device", "[plan]") {
  // One layer, one one-step sequence per mini-batch, R-part 1 ms. Device: A's T/2 [0, .5],
  // B's [.5, 1]; A's R on worker 0 [.5, 1.5], B's on worker 1 [1, 2]; then A's last T/2
  // [1.5, 2], B's [2, 2.5]: 2.5 ms. With one worker B's R-part waits for A's: [1.5, 2.5], and
  // B ends at 3 ms.
  const auto two = fd::predict_run(one_token_requests(1, 2, 2, 1, 2, 1), flat_costs(1e-3));
  CHECK(two.seconds == Approx(0.0025));
  CHECK(two.s_busy == Approx(0.002 / 0.0025));
  CHECK(two.r_busy == Approx(0.001 / 0.0025));
  const auto one = fd::predict_run(one_token_requests(1, 2, 1, 1, 2, 1), flat_costs(1e-3));
  CHECK(one.seconds == Approx(0.003));
  // Hand-over costs lie on every mini-batch's path: they can only lengthen the run.
  auto costs = flat_costs(1e-3);
  costs.s_hop_seconds = costs.r_hop_seconds = 1e-4;
  costs.step_seconds = 1e-4;
  const auto hops = fd::predict_run(one_token_requests(1, 2, 2, 1, 2, 1), costs);
  CHECK(hops.seconds > two.seconds);
}

TEST_CASE("run prediction: each mini-batch's sequences spread over the workers", "[plan]") {
  // Two mini-batches of 2 one-step sequences on 2 workers: each mini-batch puts one sequence on
  // each worker, so its R-part takes one sequence's time (1 token · R), not two.
  const auto p = fd::predict_run(one_token_requests(1, 2, 2, 2, 4, 1), flat_costs(1e-3));
  CHECK(p.tokens == 4);
  CHECK(p.r_layer_s == Approx(1e-3));
}

TEST_CASE("run prediction: invalid runs throw", "[plan]") {
  auto shape = one_token_requests(1, 1, 1, 1, 1, 1);
  shape.requests.clear();
  CHECK_THROWS_AS(fd::predict_run(shape, flat_costs(1e-3)), fd::Error);
  CHECK_THROWS_AS(fd::predict_run(one_token_requests(1, 1, 1, 1, 1, 1), flat_costs(0)), fd::Error);
}
