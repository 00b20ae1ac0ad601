// The paper's workload-balanced hardware selection: from T(B), one layer's S-part latency at
// batch B, and R, the R-part seconds per cached token per layer on one R-worker (one CPU thread),
// choose the batch size B and the number of R-workers P, and predict throughput. Equation labels
// refer to the paper (fastdecode-paper.tex, section "Workload-balanced Hardware Selection").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/load_control.h"
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

// Seconds a shard pays the first time it writes a KV page of one layer (block_tokens tokens),
// beyond writing a page it wrote before: the kernel maps and zeroes fresh memory on first touch
// (compacting memory for a huge page when it must). A fresh store of `bytes` is filled twice.
double measure_page_first_touch(const ModelConfig& shape, size_t bytes);

// A concrete run as `fastdecode-bench plan` performs it: every request arrives at once; each
// mini-batch admits from the one queue, first come first served, under its own LoadPlanner.
struct RunShape {
  int n_layers = 0;                // N
  int pipeline = 1;                // mini-batches in flight; they share the S-part device
  int workers = 1;                 // P: shards, one R-worker thread each
  int page_tokens = 16;            // a shard's page: placement counts pages
  int page_layers = 1;             // layers whose pages a token takes on a worker (N)
  ScheduleConfig schedule;         // per mini-batch: kind, B, S, F, M, W_lim
  std::vector<SeqShape> requests;  // base = prompt tokens - 1, steps = tokens to generate
};

// What the real system pays besides T(B) and R, each measured by a micro-benchmark.
struct RunCosts {
  SimProfile spart;                 // T(rows): one layer's S-part on the device
  double r_seconds = 0;             // R per cached token per layer, all P workers busy
  double r_fixed_seconds = 0;       // shard time per request besides R·tokens (append, dispatch)
  double r_hop_seconds = 0;         // a shard request's round trip outside the shard (messages, copies)
  double s_hop_seconds = 0;         // an S-part request's round trip outside the device
  double step_seconds = 0;          // per step: logits to the micro-batches, sampling, next rows
  double page_touch_seconds = 0;    // a worker's first write of a KV page (one layer)
};

struct RunPrediction {
  double seconds = 0;        // from the first step's start to the last step's end
  int64_t tokens = 0;        // tokens generated
  double tokens_per_s = 0;   // tokens / seconds
  int64_t steps = 0;         // steps of all mini-batches
  double s_busy = 0;         // fraction of `seconds` the S-part device works
  double r_busy = 0;         // mean fraction of `seconds` a worker computes
  double t_layer_s = 0;      // mean S-part seconds of one layer of one step, T(rows)
  double r_layer_s = 0;      // mean R-part seconds of one layer of one step, slowest worker
};

// Replays the run in time: per step and mini-batch, embed+attn_in (T/2), then per layer the
// R-part on the workers that hold its sequences and the S-part (T), the last one T/2; the device
// and each worker serve requests one at a time in arrival order, so two mini-batches overlap
// their S- and R-parts exactly as far as the hand-over costs let them. Sequences are placed as
// the scheduler places them (fewest pages of their mini-batch, then fewest of all), and a sequence
// admitted while its mini-batch runs joins one step later, as in the actor system. A worker's
// store reuses freed pages first, so it touches fresh pages only when its pages in use pass
// their high-water mark; each costs page_touch_seconds in the step's first R-part.
// Throws fd::Error for an empty or invalid shape.
RunPrediction predict_run(const RunShape& run, const RunCosts& costs);

}  // namespace fd
