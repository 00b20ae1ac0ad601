// When sequences may start: the paper's sequence-level load-stabilizing schedule and its
// load-control generalisation (Algorithm 1), as a planner a driver asks once per step.
//
// The R-part load of a step, W(t), is the sum over running sequences of their current length.
// A sequence that starts at step t0 with `base` tokens already cached has length base + i at its
// i-th step, step t0 + i - 1 (the paper's model is base = 0: lengths 1..S). Steps are the
// driver's generation steps, consecutive integers; every sequence advances one token per step.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fd {

enum class ScheduleKind {
  large_batch,   // B sequences start together; the next batch when all have ended
  sls,           // M = B·F/S sequences start every F steps (load-stabilizing schedule)
  load_control,  // Algorithm 1: a micro-batch of M starts at the earliest step under W_lim
};
const char* schedule_name(ScheduleKind kind);
// Parses "large-batch", "sls" or "load-control"; false for anything else.
bool parse_schedule(const std::string& text, ScheduleKind* kind);

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::load_control;
  int batch = 256;         // B: sequences in flight at steady state
  int seq_len = 1024;      // S: steps a sequence runs (the paper's maximum sequence length)
  int interval = 16;       // F: steps between micro-batch starts (sls; load_control's cold start)
  int micro_batch = 0;     // M: sequences per micro-batch; 0 = round(B·F/S), or 1 with F = ⌈S/B⌉ when B·F < S
  // W_lim in tokens; 0 = the paper's W'_max = B(S+F)/2 plus, since its model has no prompts,
  // B times the mean cached prompt (SeqShape::base) of the sequences of the latest cold start
  // and two standard deviations of the sum of B such prompts
  int64_t load_limit = 0;
  bool default_limit = false;  // set by resolve_schedule when load_limit was 0
};

// The config with defaults filled in; throws fd::Error naming a non-positive field.
ScheduleConfig resolve_schedule(const ScheduleConfig& cfg);

// A sequence as the planner sees it. For a request with a prompt of p tokens and at most g new
// tokens: base = p - 1, steps = g (its first step caches the prompt, length p = base + 1).
struct SeqShape {
  int base = 0;   // tokens cached before its first step
  int steps = 0;  // the most steps it runs (>= 1)
};

// What start() returns and finish() takes back; opaque to the driver.
struct SeqTicket {
  int64_t start = 0;   // its first step
  int64_t end = 0;     // its last planned step
  int64_t offset = 0;  // its length at step t is t + offset
};

// Step-driven planner. Per step t (non-decreasing across calls), the driver:
//   while (a sequence waits && planner.quota(t, shape) > 0) ticket = planner.start(t, shape);
// and, when a sequence stops after step t (EOS, stop string, cancel, or its last planned step),
//   planner.finish(ticket, t);
// load_control never plans a step above W_lim (the one exception: a sequence whose own peak
// base + steps exceeds W_lim starts alone once nothing runs, so that it cannot starve).
// Cold start of load_control: while the first sequences of a start from empty still run (S
// steps), micro-batches start every F steps, as in sls; W_lim alone would start W_lim/S sequences
// at once and make their last step a peak (the paper, end of the load-stabilizing section).
class LoadPlanner {
 public:
  explicit LoadPlanner(const ScheduleConfig& cfg);
  const ScheduleConfig& config() const { return cfg_; }
  // W_lim now: the configured limit, or the default one for the latest cold start's prompts.
  int64_t load_limit() const;

  // How many more sequences of this shape may start at `step`.
  int quota(int64_t step, const SeqShape& shape) const;
  // Records a sequence starting at `step` (quota need not allow it: the driver decides).
  SeqTicket start(int64_t step, const SeqShape& shape);
  // The sequence ran its last step at `last_step`; its planned load after that is released.
  void finish(const SeqTicket& ticket, int64_t last_step);

  // Planned load and sequences at `step` (>= the latest start), counting finish() releases.
  int64_t planned_load(int64_t step) const;
  int running(int64_t step) const;
  // How many sequences of this shape could start at `step` keeping every planned step <= limit.
  int64_t fits(int64_t step, const SeqShape& shape, int64_t limit) const;
  // Algorithm 1's GetEarliestStep: the first step >= `step` at which n sequences of this shape
  // fit under W_lim given what is planned now, or -1 when n of them never fit. Two deliberate
  // differences from the paper's listing: (1) it returns E - x + 1 with E = t + S, one step past
  // its last step t + S - 1 (its AddMicroBatch counts length S at E), which starts every
  // micro-batch a step later than W_lim requires and, under W_lim = 24, would not reproduce its
  // own figure; here the bound is exact. (2) The load at a new micro-batch's last step also counts
  // micro-batches started at the same step.
  int64_t earliest_step(int64_t step, int n, const SeqShape& shape) const;

 private:
  struct Group {
    int64_t n = 0;       // sequences ending at this step
    int64_t offset = 0;  // sum of their offsets: their load at step t is n·t + offset
  };
  int started_at(int64_t step) const { return step == last_start_ ? started_last_ : 0; }
  // W_lim for starting `next`: the default one takes next's prompt as the mean until a cold
  // start has begun.
  int64_t limit_for(const SeqShape& next) const;
  // Fewest steps between two starts after the cold start (see load_control.cc).
  int64_t start_gap() const;

  ScheduleConfig cfg_;
  int64_t cold_started_ = 0;       // sequences started in the latest cold start
  int64_t cold_base_sum_ = 0;      // their cached prompts, tokens
  int64_t cold_base_sq_sum_ = 0;   // the sum of their squares, tokens²
  int64_t planned_steps_ = 0;      // steps planned for the finished sequences
  int64_t actual_steps_ = 0;       // steps they ran
  std::map<int64_t, Group> ends_;  // by last planned step
  int64_t last_start_ = INT64_MIN;
  int started_last_ = 0;           // sequences started at last_start_
  int64_t cold_begin_ = 0;         // step of the latest start from empty
};

// A request of a simulated run: it arrives at `arrival` and stops after `actual_steps` steps
// (<= shape.steps; fewer models EOS).
struct SimRequest {
  SeqShape shape;
  int actual_steps = 0;
  int64_t arrival = 0;
};

struct LoadTrace {
  std::vector<int64_t> load;   // [steps] W(t): sum of current lengths of the running sequences
  std::vector<int> running;    // [steps] sequences running at t
  std::vector<int> started;    // [steps] sequences started at t
  int64_t peak = 0;            // max of load
  int64_t tokens = 0;          // sum of running: tokens generated in the trace
  int64_t finished = 0;        // sequences that ended within the trace
};

// Drives a LoadPlanner over `steps` steps with the requests served first come, first served,
// exactly as the reference driver loop above; the loads are counted from the sequences that
// actually run, independently of the planner's bookkeeping.
LoadTrace simulate_schedule(const ScheduleConfig& cfg, const std::vector<SimRequest>& requests,
                            int64_t steps);

}  // namespace fd
