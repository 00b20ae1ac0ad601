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
  double s_busy_ms = 0, r_busy_ms = 0; // union of S spans / of shard R spans over the window
  double window_ms = 0;                // from the first step start to the last step end
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
  double s_idle_frac = 0;     // 1 - S busy / window
  double r_idle_frac = 0;     // 1 - R busy / window
};
ScheduleSummary summarize(const ScheduleRunResult& run);

// argv[0] is the mode name ("schedule"). Returns the process exit code.
int bench_schedule_main(int argc, char** argv);

}  // namespace fd
