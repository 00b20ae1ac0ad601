// `fastdecode-bench plan`: the performance model's tokens/s for a configuration this machine can
// run (simulated S-part from a profile, real shards), then that configuration run for real.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "examples/common/bench_schedule.h"
#include "runtime/load_control.h"
#include "runtime/model.h"
#include "runtime/perf_model.h"

namespace fd {

// The configuration to predict and run.
struct PlanRunConfig {
  ModelConfig shape;             // random model: layers, dim, heads, kv heads, ff, vocab
  std::string sim_profile;       // T(B) of the simulated S-part
  ScheduleConfig schedule;       // kind, B per mini-batch, S, F
  int pipeline = 2;              // mini-batches in flight
  int shards = 2;                // P: R-worker shards, one thread each
  int requests = 0;              // 0: 4·B·pipeline
  int threads = 2;               // actor scheduler threads
  double min_time = 0.3;         // seconds per micro-benchmark
  uint64_t seed = 1;
};

// The micro-benchmarks behind the prediction, measured here and now on real actors: R on P shard
// actors asked at once (the run's mean sequences per shard at its mean length, append and
// attention), one shard request's fixed cost and its round trip outside the compute, one S-part
// request's round trip on a zero-time simulated device, an empty round trip per step, and the
// first write of a fresh KV page.
RunCosts calibrate_run(const PlanRunConfig& cfg);

// The requests the run sends (prompts of 2..8 tokens, S new tokens each) and the shape the model
// replays. Throws fd::Error for an invalid configuration.
std::vector<gen_request> plan_requests(const PlanRunConfig& cfg, int32_t bos);
RunShape plan_run_shape(const PlanRunConfig& cfg, const std::vector<gen_request>& reqs);

struct PlanVsRun {
  RunCosts costs;
  RunPrediction predicted;
  ScheduleRunResult run;
  ScheduleSummary summary;
  double measured_tokens_per_s = 0;  // generated tokens / wall time of the run
  double ratio = 0;                  // predicted / measured
};

// Calibrates, predicts, runs. Throws fd::Error when a request fails.
PlanVsRun plan_vs_run(const PlanRunConfig& cfg);

// argv[0] is the mode name ("plan"). Returns the process exit code.
int bench_plan_main(int argc, char** argv);

}  // namespace fd
