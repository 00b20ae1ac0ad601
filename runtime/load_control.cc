#include "runtime/load_control.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/error.h"

namespace fd {

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::large_batch: return "large-batch";
    case ScheduleKind::sls: return "sls";
    case ScheduleKind::load_control: return "load-control";
  }
  return "?";
}

bool parse_schedule(const std::string& text, ScheduleKind* kind) {
  for (ScheduleKind k : {ScheduleKind::large_batch, ScheduleKind::sls, ScheduleKind::load_control}) {
    if (text == schedule_name(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

ScheduleConfig resolve_schedule(const ScheduleConfig& cfg) {
  if (cfg.batch < 1 || cfg.seq_len < 1 || cfg.interval < 1) {
    throw Error("The schedule needs a positive batch size, sequence length and start interval, got B=" +
                std::to_string(cfg.batch) + ", S=" + std::to_string(cfg.seq_len) +
                ", F=" + std::to_string(cfg.interval) + ".");
  }
  if (cfg.micro_batch < 0 || cfg.load_limit < 0) {
    throw Error("The micro-batch size and the load limit may not be negative (0 picks the default).");
  }
  ScheduleConfig r = cfg;
  const double b = cfg.batch, s = cfg.seq_len, f = cfg.interval;
  // M = B·F/S (the paper's micro-batch equation). Below one sequence, one starts every ⌈S/B⌉
  // steps instead: one every F steps would keep S/F sequences in flight, not B (B = 8, S = 256,
  // F = 8: 32, four times the KV memory asked for).
  if (r.micro_batch == 0 && b * f < s) {
    r.micro_batch = 1;
    r.interval = (cfg.seq_len + cfg.batch - 1) / cfg.batch;
  } else if (r.micro_batch == 0) {
    r.micro_batch = static_cast<int>(std::llround(b * f / s));
  }
  // W'_max = B(S+F)/2, the steady-state peak of the load-stabilizing schedule (prompts aside:
  // LoadPlanner adds them).
  if (r.load_limit == 0) {
    r.load_limit = int64_t{cfg.batch} * (int64_t{cfg.seq_len} + r.interval) / 2;
    r.default_limit = true;
  }
  return r;
}

LoadPlanner::LoadPlanner(const ScheduleConfig& cfg) : cfg_(resolve_schedule(cfg)) {}

// In sls's steady pattern every sequence is `base` tokens longer than in the paper's model, so
// its peak is B(S+F)/2 + B·base: a default W_lim without the prompts would keep load control
// from sustaining that pattern (with 1-7 token prompts, B = 32, S = 128, F = 8, it starved after
// the cold start and settled at 18 sequences per mini-batch started in step, a smaller large
// batch). Prompts that differ in length make the sum of the B running sequences' prompts swing
// around B·mean: with the mean alone, every start whose prompts were longer than those it
// replaced waited, and 30.4 of 32 sequences ran on average (simulated, the same shapes), against
// 32 with two standard deviations of that sum added, at sls's own peak. Mean and spread are
// taken over the cold start's sequences and then held: a limit that moved with every start
// would lie below plans made under an earlier, higher one, block starts until their ends passed,
// and so bunch the starts again.
int64_t LoadPlanner::limit_for(const SeqShape& next) const {
  if (!cfg_.default_limit) return cfg_.load_limit;
  if (cold_started_ == 0) return cfg_.load_limit + int64_t{cfg_.batch} * next.base;
  const double n = double(cold_started_), mean = double(cold_base_sum_) / n;
  const double var = std::max(0.0, double(cold_base_sq_sum_) / n - mean * mean);
  const double b = cfg_.batch;
  return cfg_.load_limit + static_cast<int64_t>(std::llround(b * mean + 2 * std::sqrt(b * var)));
}

int64_t LoadPlanner::load_limit() const { return limit_for(SeqShape{}); }

int LoadPlanner::quota(int64_t step, const SeqShape& shape) const {
  const int now = started_at(step);
  const int live = running(step);
  switch (cfg_.kind) {
    case ScheduleKind::large_batch:
      return live > now ? 0 : std::max(0, cfg_.batch - now);
    case ScheduleKind::sls: {
      const int64_t f = cfg_.interval;
      return ((step % f) + f) % f != 0 ? 0 : std::max(0, cfg_.micro_batch - now);
    }
    case ScheduleKind::load_control: {
      const int64_t begin = live == 0 ? step : cold_begin_;
      const bool cold = step < begin + cfg_.seq_len;
      if (cold && (step - begin) % cfg_.interval != 0) return 0;
      const int room = cfg_.micro_batch - now;
      if (room <= 0) return 0;
      const int64_t fit = fits(step, shape, limit_for(shape));
      if (live == 0 && fit == 0) return 1;  // too long for W_lim: it runs alone rather than never
      // A micro-batch opens when all M fit (Algorithm 1); once open, or in a cold-start slot,
      // it takes as many as fit.
      if (!cold && now == 0 && fit < cfg_.micro_batch) return 0;
      if (!cold && now == 0 && step - last_start_ < start_gap()) return 0;
      return static_cast<int>(std::min<int64_t>(room, fit));
    }
  }
  return 0;
}

SeqTicket LoadPlanner::start(int64_t step, const SeqShape& shape) {
  if (shape.steps < 1 || shape.base < 0) {
    throw Error("A planned sequence needs at least one step and a non-negative cached length, got " +
                std::to_string(shape.steps) + " steps after " + std::to_string(shape.base) + " tokens.");
  }
  if (step < last_start_) {
    throw Error("The load planner was asked to start a sequence at step " + std::to_string(step) +
                ", before the step " + std::to_string(last_start_) + " of an earlier start.");
  }
  if (running(step) == 0) {
    cold_begin_ = step;
    cold_started_ = cold_base_sum_ = cold_base_sq_sum_ = 0;
  }
  if (step < cold_begin_ + cfg_.seq_len) {
    ++cold_started_;
    cold_base_sum_ += shape.base;
    cold_base_sq_sum_ += int64_t{shape.base} * shape.base;
  }
  ends_.erase(ends_.begin(), ends_.lower_bound(step));
  SeqTicket t;
  t.start = step;
  t.end = step + shape.steps - 1;
  t.offset = int64_t{shape.base} - step + 1;
  Group& g = ends_[t.end];
  g.n += 1;
  g.offset += t.offset;
  if (step == last_start_) {
    ++started_last_;
  } else {
    last_start_ = step;
    started_last_ = 1;
  }
  return t;
}

// Algorithm 1 alone starts a micro-batch at the earliest step under W_lim, and nothing keeps
// those steps apart: when a start is held back, the next ones follow right after it, their ends
// bunch, and the bunches grow until load control runs like a smaller large batch (with 1-7 token
// prompts, B = 32, S = 128, F = 8: 20 of 32 sequences running on average instead of 30).
// Starts are therefore at least F·r steps apart, r the steps sequences actually ran over the
// steps planned for them: F for sequences that run their course, as in sls, and as often as
// needed to keep B running when they end early.
int64_t LoadPlanner::start_gap() const {
  if (planned_steps_ == 0) return cfg_.interval;
  const double r = double(actual_steps_) / double(planned_steps_);
  return std::max<int64_t>(1, std::llround(cfg_.interval * r));
}

void LoadPlanner::finish(const SeqTicket& ticket, int64_t last_step) {
  planned_steps_ += ticket.end - ticket.start + 1;
  actual_steps_ += std::clamp<int64_t>(last_step - ticket.start + 1, 1, ticket.end - ticket.start + 1);
  if (last_step >= ticket.end) return;  // ran to its planned end: nothing left to release
  auto it = ends_.find(ticket.end);
  if (it == ends_.end() || it->second.n == 0) return;
  it->second.n -= 1;
  it->second.offset -= ticket.offset;
  if (it->second.n == 0) ends_.erase(it);
}

int64_t LoadPlanner::planned_load(int64_t step) const {
  int64_t w = 0;
  for (auto it = ends_.lower_bound(step); it != ends_.end(); ++it)
    w += it->second.n * step + it->second.offset;
  return w;
}

int LoadPlanner::running(int64_t step) const {
  int64_t n = 0;
  for (auto it = ends_.lower_bound(step); it != ends_.end(); ++it) n += it->second.n;
  return static_cast<int>(n);
}

// The load only rises between two ends, so the planned peaks are the loads at the last steps of
// sequences (Algorithm 1 keeps W at the ending steps E). A new sequence ending at `en` adds
// e + c1 at an existing end e <= en; the loads at ends after en do not change.
int64_t LoadPlanner::fits(int64_t step, const SeqShape& shape, int64_t limit) const {
  const int64_t en = step + shape.steps - 1;
  const int64_t c1 = int64_t{shape.base} - step + 1;
  int64_t best = std::numeric_limits<int64_t>::max();
  int64_t n = 0, off = 0;  // sequences ending at or after the current end, and their offsets
  const auto check = [&](int64_t e) {
    const int64_t room = limit - (n * e + off);
    best = room < 0 ? 0 : std::min(best, room / (e + c1));
  };
  bool checked_en = false;
  for (auto it = ends_.rbegin(); it != ends_.rend() && it->first >= step; ++it) {
    const int64_t e = it->first;
    if (!checked_en && e < en) {
      check(en);
      checked_en = true;
    }
    n += it->second.n;
    off += it->second.offset;
    if (e <= en) check(e);
    if (e == en) checked_en = true;
  }
  if (!checked_en) check(en);
  return best;
}

int64_t LoadPlanner::earliest_step(int64_t step, int n, const SeqShape& shape) const {
  const int64_t last = ends_.empty() ? step : std::max(step, ends_.rbegin()->first + 1);
  for (int64_t r = step; r <= last; ++r)
    if (fits(r, shape, limit_for(shape)) >= n) return r;
  return -1;  // at `last` nothing runs any more, and still n do not fit
}

LoadTrace simulate_schedule(const ScheduleConfig& cfg, const std::vector<SimRequest>& requests,
                            int64_t steps) {
  for (const SimRequest& r : requests) {
    if (r.actual_steps < 1 || r.actual_steps > r.shape.steps) {
      throw Error("A simulated request runs " + std::to_string(r.actual_steps) +
                  " steps, outside 1.." + std::to_string(r.shape.steps) + " of its plan.");
    }
  }
  struct Run {
    const SimRequest* req;
    SeqTicket ticket;
    int64_t start;
  };
  LoadPlanner planner(cfg);
  LoadTrace tr;
  tr.load.assign(static_cast<size_t>(std::max<int64_t>(steps, 0)), 0);
  tr.running.assign(tr.load.size(), 0);
  tr.started.assign(tr.load.size(), 0);
  std::vector<Run> runs;
  size_t next = 0;
  for (int64_t t = 0; t < steps; ++t) {
    const size_t i = static_cast<size_t>(t);
    while (next < requests.size() && requests[next].arrival <= t &&
           planner.quota(t, requests[next].shape) > 0) {
      runs.push_back(Run{&requests[next], planner.start(t, requests[next].shape), t});
      ++next;
      ++tr.started[i];
    }
    for (const Run& r : runs) tr.load[i] += r.req->shape.base + (t - r.start + 1);
    tr.running[i] = static_cast<int>(runs.size());
    tr.tokens += tr.running[i];
    tr.peak = std::max(tr.peak, tr.load[i]);
    auto done = std::stable_partition(runs.begin(), runs.end(), [t](const Run& r) {
      return t - r.start + 1 < r.req->actual_steps;
    });
    for (auto it = done; it != runs.end(); ++it) planner.finish(it->ticket, t);
    tr.finished += runs.end() - done;
    runs.erase(done, runs.end());
  }
  return tr;
}

}  // namespace fd
