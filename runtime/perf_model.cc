#include "runtime/perf_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "runtime/error.h"
#include "runtime/kv_store.h"
#include "runtime/spart.h"

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;

void check_input(const PlanInput& in) {
  if (in.n_layers < 1 || in.seq_len < 1)
    throw Error("The plan needs a positive layer count and sequence length.");
  if (!(in.r_seconds > 0) || !(in.kv_tokens_per_node > 0) || in.workers_per_node < 1)
    throw Error("The plan needs a positive R-part time per token, KV capacity per node and "
                "workers per node.");
  if (!(in.latency_limit >= 0)) throw Error("The latency limit may not be negative.");
  if (!(in.gain >= 0 && in.gain < 1)) throw Error("The marginal gain must lie in [0, 1).");
  if (in.spart.batch.empty()) throw Error("The plan needs S-part latencies T(B) for at least one batch size.");
  if (in.max_batch < 0) throw Error("The largest batch size may not be negative.");
}

int max_batch(const PlanInput& in) { return in.max_batch > 0 ? in.max_batch : in.spart.batch.back(); }

template <class F>
double time_median(double min_time, F&& fn) {
  std::vector<double> reps;
  const auto start = Clock::now();
  do {
    const auto t0 = Clock::now();
    fn();
    reps.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  } while (std::chrono::duration<double>(Clock::now() - start).count() < min_time);
  std::sort(reps.begin(), reps.end());
  return reps[reps.size() / 2];
}

}  // namespace

PlanRow evaluate_plan(const PlanInput& in, int batch) {
  check_input(in);
  if (batch < 1) throw Error("The batch size must be at least 1.");
  PlanRow r;
  const double b = batch, s = in.seq_len, n = in.n_layers;
  r.batch = batch;
  r.t_spart = in.spart.layer_seconds(b);
  if (!(r.t_spart > 0)) {
    throw Error("The S-part latency T(" + std::to_string(batch) + ") of " + in.spart.source +
                " is not positive, so no balance can be computed.");
  }
  r.efficiency = b / r.t_spart;
  // (equ:cpucon) P ≈ B·S·R / (2·T(B)): the mean load B·S/2 tokens over P workers takes T(B).
  r.p_balance = b * s * in.r_seconds / (2 * r.t_spart);
  // (equ:memcon) ½·B·S ≤ C·P, with C the tokens one worker's share of a node holds.
  const double c_worker = in.kv_tokens_per_node / in.workers_per_node;
  r.p_memory = static_cast<int>(std::ceil(b * s / 2 / c_worker - 1e-9));
  r.workers = std::max({1, static_cast<int>(std::ceil(r.p_balance - 1e-9)), r.p_memory});
  r.nodes = (r.workers + in.workers_per_node - 1) / in.workers_per_node;
  r.t_rpart = b * s * in.r_seconds / (2 * r.workers);
  // The micro-batch alternates S-part and R-part layer by layer; with P from equ:cpucon the
  // R-part takes about T(B), so a step is 2·N·T(B) and a sequence 2·N·S·T(B) (equ:bscon).
  r.step_seconds = n * (r.t_spart + r.t_rpart);
  r.tokens_per_second = b / r.step_seconds;
  r.seq_seconds = s * r.step_seconds;
  r.meets_latency = in.latency_limit == 0 || 2 * n * s * r.t_spart <= in.latency_limit * (1 + 1e-12);
  r.load_limit = static_cast<int64_t>(std::floor(r.workers * r.t_spart / in.r_seconds * (1 + 1e-12)));
  return r;
}

Plan recommend_plan(const PlanInput& in) {
  check_input(in);
  const int top = max_batch(in);
  Plan p;
  if (in.latency_limit > 0) {
    // (equ:bscon) 2·N·S·T(B) ≤ L: the largest B that meets it.
    for (int b = top; b >= 1; --b) {
      if (evaluate_plan(in, b).meets_latency) {
        p.best = evaluate_plan(in, b);
        p.feasible = true;
        p.reason = "the largest batch size up to " + std::to_string(top) +
                   " whose sequences finish within the latency limit (2·N·S·T(B) <= L)";
        return p;
      }
    }
    p.best = evaluate_plan(in, 1);
    p.reason = "even batch size 1 misses the latency limit: 2·N·S·T(1) > L";
    return p;
  }
  // No L: the smallest B whose E(B) = B/T(B) is within `gain` of the best E up to `top`;
  // a larger B buys only marginal throughput.
  std::vector<double> e(static_cast<size_t>(top) + 1, 0.0);
  double e_max = 0;
  for (int b = 1; b <= top; ++b) {
    e[b] = evaluate_plan(in, b).efficiency;
    e_max = std::max(e_max, e[b]);
  }
  int pick = top;
  for (int b = 1; b <= top; ++b) {
    if (e[b] >= (1 - in.gain) * e_max) {
      pick = b;
      break;
    }
  }
  p.best = evaluate_plan(in, pick);
  p.feasible = true;
  p.reason = "no latency limit: the smallest batch size up to " + std::to_string(top) +
             " with B/T(B) within " + std::to_string(static_cast<int>(std::lround(in.gain * 100))) +
             " % of the best";
  return p;
}

double kv_bytes_per_token(const ModelConfig& shape) {
  return 2.0 * shape.n_layers * shape.kv_width() * sizeof(uint16_t);
}

SimProfile measure_cpu_spart(const ModelConfig& shape, const std::vector<int>& batches, double min_time) {
  ModelConfig c = shape;
  c.n_layers = 1;
  c.vocab = 259;  // the smallest vocabulary make_random_model accepts; the LM head is not timed
  c.ctx = std::max(c.ctx, 4096);
  const Model m = make_random_model(c, 1);
  const auto be = make_cpu_backend(m);
  SimProfile p;
  p.model = "cpu backend, dim " + std::to_string(c.dim) + ", ff " + std::to_string(c.ff);
  p.source = "measured";
  for (int b : batches) {
    if (b < 1 || (!p.batch.empty() && b <= p.batch.back()))
      throw Error("Batch sizes to measure must be positive and increasing.");
    StepInput in;
    in.tokens.assign(static_cast<size_t>(b), 1);
    in.pos.assign(static_cast<size_t>(b), 100);  // a decode step: one token per sequence
    auto st = be->make_state();
    be->embed(*st, in);
    AttnIn a;
    std::vector<float> o(static_cast<size_t>(b) * c.q_width(), 0.01f);  // [B][q_width]
    const auto layer = [&] {
      be->attn_in(*st, 0, a);
      be->attn_out(*st, 0, o.data());
    };
    layer();  // warm-up: buffers, BLAS threads
    p.batch.push_back(b);
    p.seconds.push_back(time_median(min_time, layer));
  }
  return p;
}

double measure_r_seconds(const ModelConfig& shape, int seq_tokens, size_t kv_bytes, double min_time) {
  const int head_dim = shape.head_dim > 0 ? shape.head_dim : shape.dim / std::max(shape.n_heads, 1);
  const int kv_heads = shape.n_kv_heads > 0 ? shape.n_kv_heads : shape.n_heads;
  if (seq_tokens < 1 || head_dim < 1 || kv_heads < 1 || shape.n_heads % kv_heads != 0)
    throw Error("The R-part benchmark needs a positive sequence length and a valid head layout.");
  const size_t row = static_cast<size_t>(kv_heads) * head_dim;                    // one token's K
  const size_t token_bytes = 2 * row * sizeof(uint16_t);                          // K and V
  const size_t seqs = std::max<size_t>(1, (kv_bytes + seq_tokens * token_bytes - 1) / (seq_tokens * token_bytes));
  KvStoreConfig kc;
  kc.n_layers = 1;
  kc.n_kv_heads = kv_heads;
  kc.head_dim = head_dim;
  const size_t blocks = (static_cast<size_t>(seq_tokens) + kc.block_tokens - 1) / kc.block_tokens;
  const size_t page = (2 * row * kc.block_tokens * sizeof(uint16_t) + 63) / 64 * 64;
  kc.capacity_bytes = page * blocks * seqs;
  KvStore store(kc);
  std::vector<float> f(static_cast<size_t>(seq_tokens) * row);  // [seq_tokens][row]
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  std::vector<uint16_t> k(f.size()), v(f.size());
  kernels::f32_to_f16(f.data(), k.data(), f.size());
  std::reverse(f.begin(), f.end());
  kernels::f32_to_f16(f.data(), v.data(), f.size());
  for (size_t s = 0; s < seqs; ++s) {
    store.reserve(s, seq_tokens);
    store.append(s, 0, 0, k.data(), v.data(), seq_tokens);
  }
  kernels::AttnDims d;
  d.n_heads = shape.n_heads;
  d.n_kv_heads = kv_heads;
  d.head_dim = head_dim;
  std::vector<float> q(static_cast<size_t>(shape.n_heads) * head_dim, 0.1f), out(q.size());  // [n_heads*head_dim]
  const auto pass = [&] {
    for (size_t s = 0; s < seqs; ++s)
      kernels::attention_f16(q.data(), 1, seq_tokens - 1, store.view(s, 0), d, out.data());
  };
  pass();  // warm-up: commits the pages
  return time_median(min_time, pass) / (static_cast<double>(seqs) * seq_tokens);
}

}  // namespace fd
