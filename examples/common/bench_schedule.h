// `fastdecode-bench schedule`: large-batch, sls and load-control on the same workload, in one
// process, with per-step latency, S and R time and R-part load from the trace, as a CSV and an
// SVG plot of the latency at each step.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/system.h"
#include "caf/actor_system.hpp"
#include "runtime/load_control.h"
#include "runtime/model.h"

namespace fd {

// One step of one mini-batch, from its trace 'step' span.
struct ScheduleStep {
  int mini = 0;          // mini-batch index
  int64_t step = 0;      // the mini-batch's step number, from 0
  double t0_ms = 0;      // start, from the run's first step start
  double latency_ms = 0; // step wall time
  double s_ms = 0;       // S-part time of the step
  double r_ms = 0;       // R-part wall time of the step (compute and communication)
  int64_t load = 0;      // W: sum of the step's sequence lengths after it, in tokens
  int seqs = 0;          // sequences in the step
  int rows = 0;          // tokens processed (prompt rows included)
};

struct ScheduleRunResult {
  std::string schedule;                // schedule_name()
  std::vector<ScheduleStep> steps;     // in start order
  std::vector<gen_result> results;     // [requests]
  double wall_s = 0;                   // from the first request sent to the last answer
  int64_t generated = 0;               // tokens generated over all requests
  double window_ms = 0;                // from the first step start to the last step end
  // The steady window, the middle half of [first step start, last step end]:
  double steady_from_ms = 0, steady_ms = 0;  // its start (from the first step start), length
  double s_busy_ms = 0;                // the S-part device's work within it: N·T(rows) per step
                                       // for the sim backend, else the union of S spans
  double r_busy_ms = 0;                // R spans within it, mean over the shards
  int shards = 0;                      // shards that computed
  int layers = 0;                      // model layers
  std::vector<trace_event> events;     // the trace the steps were read from
};

// Starts a local node with `opt` (log off, tracing on), sends every request at once and collects
// the trace. Throws fd::Error when the node cannot start.
ScheduleRunResult run_schedule(std::shared_ptr<const Model> model, const LocalOptions& opt,
                               const std::vector<gen_request>& reqs, int threads);

struct ScheduleSummary {
  int64_t peak_load = 0;      // max W over steps of any mini-batch
  double mean_load = 0;       // mean W over steps
  double peak_step_ms = 0;    // max step latency
  double tokens_per_s = 0;    // generated tokens / wall
  double steady_tokens_per_s = 0;  // generated tokens per second in the middle half of the window
  double s_idle_frac = 0;     // 1 - S busy / steady window
  double r_idle_frac = 0;     // 1 - R busy / steady window, mean over the shards
  double s_layer_ms = 0;      // steady window: S-part ms per layer of a step, hand-overs included
  double r_layer_ms = 0;      // steady window: R-part ms per layer of a step, request to last reply
  double r_compute_layer_ms = 0;  // steady window: a shard's compute per layer of a step
};
ScheduleSummary summarize(const ScheduleRunResult& run);

// The random workload: n requests with prompts of 2..kMaxSchedulePrompt tokens (bos first), each
// generating max_new tokens.
constexpr int kMaxSchedulePrompt = 8;
std::vector<gen_request> make_schedule_requests(int n, int max_new, int vocab, int32_t bos,
                                               uint64_t seed);

// The model of the workload: random weights for a backend that computes, none for `sim`, which
// reads only the shape (a 7B-shaped layer's weights take gigabytes and seconds to make).
std::shared_ptr<Model> schedule_model(const ModelConfig& mc, const std::string& backend, uint64_t seed);

// A local node under `schedule` with `shards` R-worker shards and KV memory for the workload.
LocalOptions schedule_node_options(const ModelConfig& mc, const std::string& backend,
                                   const std::string& sim_profile, int shards, int pipeline,
                                   const ScheduleConfig& schedule);

// argv[0] is the mode name ("schedule"). Returns the process exit code.
int bench_schedule_main(int argc, char** argv);

}  // namespace fd
