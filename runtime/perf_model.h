// The paper's workload-balanced hardware selection: from T(B), one layer's S-part latency at
// batch B, and R, the R-part seconds per cached token per layer on one R-worker (one CPU thread),
// choose the batch size B and the number of R-workers P, and predict throughput. Equation labels
// refer to the paper (fastdecode-paper.tex, section "Workload-balanced Hardware Selection").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model.h"
#include "runtime/sim_backend.h"

namespace fd {

struct PlanInput {
  int n_layers = 0;                 // N
  int seq_len = 0;                  // S: tokens of a whole sequence
  double latency_limit = 0;         // L: seconds to generate a whole sequence; 0 = no limit
  double kv_tokens_per_node = 0;    // KV-cache capacity of one node, in tokens
  int workers_per_node = 1;         // R-workers (CPU threads) per node
  double r_seconds = 0;             // R: seconds per cached token per layer on one worker
  SimProfile spart;                 // T(B): one layer's S-part seconds (table, interpolated)
  int max_batch = 0;                // largest B considered; 0 = the table's largest batch
  double gain = 0.1;                // no L: smallest B within this fraction of the best B/T(B)
};

// The system at one batch size.
struct PlanRow {
  int batch = 0;               // B
  double t_spart = 0;          // T(B), seconds per layer
  double efficiency = 0;       // E(B) = B / T(B), sequences per second per layer
  double p_balance = 0;        // B·S·R / (2 T(B)): workers for R-part time = T(B) (equ:cpucon)
  int p_memory = 0;            // fewest workers holding B·S/2 tokens (equ:memcon)
  int workers = 0;             // P = max(ceil(p_balance), p_memory)
  int nodes = 0;               // ceil(P / workers_per_node)
  double t_rpart = 0;          // B·S·R / (2P): mean R-part seconds per layer
  double step_seconds = 0;     // N·(T(B) + t_rpart): one token for each of the B sequences
  double tokens_per_second = 0;  // B / step_seconds
  double seq_seconds = 0;      // S·step_seconds; 2·N·S·T(B) when balanced (equ:bscon)
  bool meets_latency = true;   // 2·N·S·T(B) <= L (equ:bscon), or no L given
  int64_t load_limit = 0;      // P·T(B)/R: the R-load (tokens) the workers finish in T(B), W_lim
};

struct Plan {
  PlanRow best;
  bool feasible = false;  // false when even B = 1 misses L
  std::string reason;     // how B was chosen, one sentence
};

// Throws fd::Error for inputs that are not positive where they must be.
PlanRow evaluate_plan(const PlanInput& in, int batch);
Plan recommend_plan(const PlanInput& in);

// KV-cache bytes of one token over all layers (K and V, fp16).
double kv_bytes_per_token(const ModelConfig& shape);

// Micro-benchmarks on this machine, single-threaded as one R-worker is (BLAS keeps its own
// thread setting for the S-part).
// T(B) of the CPU backend: attn_in + attn_out of one random layer of this shape at each batch.
SimProfile measure_cpu_spart(const ModelConfig& shape, const std::vector<int>& batches, double min_time);
// R: decode attention over a paged fp16 KV-cache of at least `kv_bytes` in sequences of
// `seq_tokens`, seconds per cached token for one layer.
double measure_r_seconds(const ModelConfig& shape, int seq_tokens, size_t kv_bytes, double min_time);

}  // namespace fd
