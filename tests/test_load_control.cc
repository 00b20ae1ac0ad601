#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "runtime/error.h"
#include "runtime/load_control.h"

namespace {

using fd::LoadPlanner;
using fd::ScheduleConfig;
using fd::ScheduleKind;
using fd::SeqShape;
using fd::SimRequest;

ScheduleConfig schedule(ScheduleKind kind, int b, int s, int f, int64_t w_lim = 0) {
  ScheduleConfig c;
  c.kind = kind;
  c.batch = b;
  c.seq_len = s;
  c.interval = f;
  c.load_limit = w_lim;
  return c;
}

std::vector<SimRequest> full_length(int n, int s) {
  std::vector<SimRequest> r(static_cast<size_t>(n));
  for (auto& x : r) {
    x.shape = SeqShape{0, s};
    x.actual_steps = s;
  }
  return r;
}

std::vector<int64_t> start_steps(const fd::LoadTrace& tr) {
  std::vector<int64_t> out;
  for (size_t t = 0; t < tr.started.size(); ++t)
    if (tr.started[t] > 0) out.push_back(static_cast<int64_t>(t));
  return out;
}

}  // namespace

// The paper's Figure "sequence-level load-stabilizing schedule": sequences of length S = 6,
// batch 6, micro-batches of 2 started every 2 steps. Its plotted columns (in units of 2) are
// {3,6,9,12,15,18,3,...} for the large batch and {1,2,4,6,9,12,9,12,...} for the schedule:
// peak 36 against 24 = B(S+F)/2.
TEST_CASE("the paper's worked example: micro-batch 2, batch 6, peak 24 instead of 36", "[schedule]") {
  const auto reqs = full_length(12, 6);
  const auto large = fd::simulate_schedule(schedule(ScheduleKind::large_batch, 6, 6, 2), reqs, 12);
  CHECK(large.load == std::vector<int64_t>{6, 12, 18, 24, 30, 36, 6, 12, 18, 24, 30, 36});
  CHECK(large.peak == 36);

  const auto sls = fd::simulate_schedule(schedule(ScheduleKind::sls, 6, 6, 2), reqs, 12);
  CHECK(sls.load == std::vector<int64_t>{2, 4, 8, 12, 18, 24, 18, 24, 18, 24, 18, 24});
  CHECK(sls.peak == 24);
  // "After 4 steps of cold starting, the total number of sequences ... equals 6."
  CHECK(sls.running[4] == 6);

  // Algorithm 1 under W_lim = 24 continues the figure's schedule after the cold start.
  const auto lc = fd::simulate_schedule(schedule(ScheduleKind::load_control, 6, 6, 2, 24), reqs, 12);
  CHECK(lc.load == sls.load);
  CHECK(start_steps(lc) == std::vector<int64_t>{0, 2, 4, 6, 8, 10});
}

TEST_CASE("Algorithm 1: workload at the ending steps and the earliest step", "[schedule]") {
  LoadPlanner p(schedule(ScheduleKind::load_control, 6, 6, 2, 24));
  const SeqShape seq{0, 6};
  for (int64_t t : {0, 2, 4})
    for (int i = 0; i < 2; ++i) p.start(t, seq);
  // Micro-batches end at steps 5, 7, 9; W there = 2·(6+4+2), 2·(6+4), 2·6.
  CHECK(p.planned_load(5) == 24);
  CHECK(p.planned_load(7) == 20);
  CHECK(p.planned_load(9) == 12);
  // A new pair at step 5 would add 2·1 at step 5 (> 24); at step 6 it adds 2·2 at step 7 and
  // 2·4 at step 9 and ends at 11 with 12: max allowed = min(4/2, 12/4, 24/6) = 2.
  CHECK(p.fits(5, seq, 24) == 0);
  CHECK(p.fits(6, seq, 24) == 2);
  CHECK(p.earliest_step(5, 2, seq) == 6);
  // Three at step 6 would exceed 24 at step 7 (20 + 3·2); at step 7 they add 3·1 there, 3·3 at
  // step 9 and end with 18 at step 12. Five never fit: a micro-batch alone peaks at 5·6 = 30.
  CHECK(p.earliest_step(5, 3, seq) == 7);
  CHECK(p.earliest_step(5, 4, seq) == 7);
  CHECK(p.earliest_step(5, 5, seq) == -1);
  CHECK(p.quota(5, seq) == 0);
  CHECK(p.quota(6, seq) == 2);
}

TEST_CASE("sls peak is B(S+F)/2 and the steady load stays within B(F-1) below it", "[schedule]") {
  const int b = 256, s = 1024, f = 16;  // M = 4
  const auto tr = fd::simulate_schedule(schedule(ScheduleKind::sls, b, s, f), full_length(2000, s), 4 * s);
  const int64_t w_max = int64_t{b} * (s + f) / 2;
  CHECK(tr.peak == w_max);
  const auto lo = *std::min_element(tr.load.begin() + s, tr.load.end());
  CHECK(lo == w_max - int64_t{b} * (f - 1));
  const auto large = fd::simulate_schedule(schedule(ScheduleKind::large_batch, b, s, f), full_length(2000, s), 4 * s);
  CHECK(large.peak == int64_t{b} * s);

  // M = round(B·F/S) = 2 for B = 100: with F | S the peak is M·S(S+F)/(2F) exactly, so it
  // differs from B(S+F)/2 by the rounding of M, |M - BF/S| / (BF/S) = 28 %.
  const auto odd = fd::simulate_schedule(schedule(ScheduleKind::sls, 100, s, f), full_length(2000, s), 4 * s);
  CHECK(odd.peak == int64_t{2} * s * (s + f) / (2 * f));
  const double rel = std::abs(odd.peak - 100.0 * (s + f) / 2) / (100.0 * (s + f) / 2);
  CHECK(rel <= std::abs(2 - 100.0 * f / s) / (100.0 * f / s) + 1e-12);
}

TEST_CASE("load control: cold start ramps up in F-spaced micro-batches, no peak above W_lim", "[schedule]") {
  const int b = 256, s = 1024, f = 16;
  const auto cfg = schedule(ScheduleKind::load_control, b, s, f);
  const int64_t w_lim = fd::resolve_schedule(cfg).load_limit;
  const auto tr = fd::simulate_schedule(cfg, full_length(3000, s), 6 * s);
  CHECK(tr.peak <= w_lim);
  // Step S-1 (the last step of the first micro-batch) is no higher than the steady peaks.
  CHECK(tr.load[static_cast<size_t>(s - 1)] <= w_lim);
  const auto starts = start_steps(tr);
  REQUIRE(starts.size() > 300);
  for (size_t i = 0; i < starts.size(); ++i) {
    CHECK(starts[i] == static_cast<int64_t>(i) * f);
    CHECK(tr.started[static_cast<size_t>(starts[i])] == 4);
  }
  for (size_t t = s; t < tr.load.size(); ++t) CHECK(tr.load[t] >= w_lim - int64_t{b} * (f - 1));
}

TEST_CASE("sequences that end early release their planned load", "[schedule]") {
  LoadPlanner p(schedule(ScheduleKind::load_control, 8, 10, 2, 100));
  const SeqShape seq{5, 10};  // lengths 6..15 over steps t0..t0+9
  const auto a = p.start(0, seq);
  p.start(0, seq);
  p.start(0, seq);
  CHECK(p.planned_load(5) == 3 * 11);
  CHECK(p.fits(1, SeqShape{0, 4}, 100) == (100 - 3 * 10) / 4);  // binding at its own end, step 4
  p.finish(a, 2);  // EOS at step 2
  CHECK(p.planned_load(5) == 2 * 11);
  CHECK(p.running(3) == 2);
  CHECK(p.fits(3, SeqShape{0, 4}, 100) == (100 - 2 * 12) / 4);

  // In a run, early ends let more sequences start within the same steps, still under W_lim.
  const int s = 256, f = 16;
  const auto cfg = schedule(ScheduleKind::load_control, 64, s, f);
  const int64_t w_lim = fd::resolve_schedule(cfg).load_limit;
  auto reqs = full_length(1000, s);
  const auto full = fd::simulate_schedule(cfg, reqs, 6 * s);
  for (size_t i = 0; i < reqs.size(); i += 2) reqs[i].actual_steps = s / 4;  // EOS
  const auto early = fd::simulate_schedule(cfg, reqs, 6 * s);
  CHECK(full.peak <= w_lim);
  CHECK(early.peak <= w_lim);
  const auto started = [](const fd::LoadTrace& tr) {
    int64_t n = 0;
    for (int x : tr.started) n += x;
    return n;
  };
  CHECK(started(early) > started(full) * 5 / 4);
  // The freed load is reused. Kept at M/F = 1/4 starts per step, the mean load would be
  // 1/4 · (S(S+1)/2 + q(q+1)/2) / 2 with q = S/4 (about half of W_lim); it is well above.
  const int q = s / 4;
  const double fixed_rate = 0.25 * (s * (s + 1) / 2.0 + q * (q + 1) / 2.0) / 2.0;
  double sum = 0;
  for (size_t t = 3 * s; t < early.load.size(); ++t) sum += static_cast<double>(early.load[t]);
  CHECK(sum / static_cast<double>(early.load.size() - 3 * s) > 1.5 * fixed_rate);
}

TEST_CASE("load control never plans above W_lim for random shapes, arrivals and early ends", "[schedule]") {
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    auto cfg = schedule(ScheduleKind::load_control, 32, 200, 1 + static_cast<int>(rng() % 20));
    const int64_t w_lim = fd::resolve_schedule(cfg).load_limit;
    std::vector<SimRequest> reqs(300);
    int64_t arrival = 0;
    for (auto& r : reqs) {
      r.shape.base = static_cast<int>(rng() % 60);
      r.shape.steps = 1 + static_cast<int>(rng() % 200);
      r.actual_steps = 1 + static_cast<int>(rng() % static_cast<unsigned>(r.shape.steps));
      arrival += static_cast<int64_t>(rng() % 3);
      r.arrival = arrival;
    }
    INFO("round " << round << ", F = " << cfg.interval);
    // The default W_lim follows the mean prompt (at most 59 tokens here); a given one is fixed.
    const auto by_default = fd::simulate_schedule(cfg, reqs, 40000);
    CHECK(by_default.peak <= w_lim + 32 * 59);
    CHECK(by_default.finished == static_cast<int64_t>(reqs.size()));  // nobody starves
    cfg.load_limit = w_lim;
    const auto tr = fd::simulate_schedule(cfg, reqs, 40000);
    CHECK(tr.peak <= w_lim);
    CHECK(tr.finished == static_cast<int64_t>(reqs.size()));
  }
}

// Prompts of different lengths hold a start back now and then; the starts that follow must not
// bunch behind it (they did: 20 of 32 sequences running on average, started in step). The
// default W_lim leaves room for the swing of the running prompts' sum, so load control keeps
// nearly all B running below sls's peak: over these 8 draws 31.9 of 32 on average, against 31.2
// (30.5-32.0) with room for the mean prompt alone.
TEST_CASE("load control keeps its starts spread when prompts differ in length", "[schedule]") {
  const int b = 32, s = 128, f = 8;
  double running = 0;
  for (unsigned seed = 1; seed <= 8; ++seed) {
    std::mt19937 rng(seed);
    std::vector<SimRequest> reqs(600);
    for (auto& r : reqs) {
      r.shape = SeqShape{1 + static_cast<int>(rng() % 7), s};
      r.actual_steps = s;
    }
    const auto tr = fd::simulate_schedule(schedule(ScheduleKind::load_control, b, s, f), reqs, 2000);
    const auto sls = fd::simulate_schedule(schedule(ScheduleKind::sls, b, s, f), reqs, 2000);
    for (size_t t = 300; t < 1500; ++t) running += tr.running[t];
    INFO("seed " << seed << ": peak " << tr.peak << ", sls's peak " << sls.peak);
    CHECK(tr.peak <= sls.peak);
  }
  CHECK(running / (8 * 1200) > b - 0.5);
}

// sls's steady peak with prompts of p tokens is B(S+F)/2 + B(p-1). Under the paper's W'_max alone
// load control could not keep that pattern and fell back to fewer sequences started in step.
TEST_CASE("with prompts, load control's default W_lim keeps sls's pattern and batch", "[schedule]") {
  const int b = 32, s = 128, f = 8, base = 4;
  auto cfg = schedule(ScheduleKind::load_control, b, s, f);
  std::vector<SimRequest> reqs(400);
  for (auto& r : reqs) {
    r.shape = SeqShape{base, s};
    r.actual_steps = s;
  }
  const auto lc = fd::simulate_schedule(cfg, reqs, 8 * s);
  const auto sls = fd::simulate_schedule(schedule(ScheduleKind::sls, b, s, f), reqs, 8 * s);
  const int64_t w_lim = fd::resolve_schedule(cfg).load_limit + b * base;
  CHECK(lc.peak <= w_lim);
  CHECK(sls.peak == w_lim);
  for (size_t t = 2 * s; t < lc.load.size(); ++t) {
    INFO("step " << t);
    CHECK(lc.running[t] >= b - 2);
    CHECK(lc.load[t] >= w_lim - int64_t{b} * f);
  }
  // The paper's W'_max without the prompts, given explicitly, loses about 1 sequence in 6.
  cfg.load_limit = fd::resolve_schedule(cfg).load_limit;
  const auto fixed = fd::simulate_schedule(cfg, reqs, 8 * s);
  CHECK(fixed.tokens * 100 < lc.tokens * 95);
}

TEST_CASE("large batch waits for the whole batch, an over-long sequence still runs alone", "[schedule]") {
  auto reqs = full_length(8, 10);
  reqs[1].actual_steps = 3;  // the batch is done only when its longest member is
  const auto tr = fd::simulate_schedule(schedule(ScheduleKind::large_batch, 4, 10, 2), reqs, 20);
  CHECK(std::vector<int>(tr.started.begin(), tr.started.begin() + 11) ==
        std::vector<int>{4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4});
  CHECK(tr.running[3] == 3);

  std::vector<SimRequest> big(2);
  for (auto& r : big) {
    r.shape = SeqShape{100, 50};
    r.actual_steps = 50;
  }
  const auto lone = fd::simulate_schedule(schedule(ScheduleKind::load_control, 4, 10, 2, 60), big, 120);
  CHECK(tr.finished >= 4);
  CHECK(lone.finished == 2);
  CHECK(*std::max_element(lone.running.begin(), lone.running.end()) == 1);
}

TEST_CASE("schedule configuration: defaults, names and errors", "[schedule]") {
  const auto r = fd::resolve_schedule(schedule(ScheduleKind::sls, 256, 1024, 16));
  CHECK(r.micro_batch == 4);
  CHECK(r.load_limit == 256 * 1040 / 2);
  // Under one sequence per F steps, one every ⌈S/B⌉ steps keeps B in flight (not S/F).
  const auto one = fd::resolve_schedule(schedule(ScheduleKind::sls, 1, 1024, 16));
  CHECK(one.micro_batch == 1);
  CHECK(one.interval == 1024);
  const auto few = fd::resolve_schedule(schedule(ScheduleKind::sls, 8, 256, 8));
  CHECK(few.micro_batch == 1);
  CHECK(few.interval == 32);
  CHECK(few.load_limit == 8 * (256 + 32) / 2);
  std::vector<SimRequest> reqs(40);
  for (auto& q : reqs) {
    q.shape = SeqShape{0, 256};
    q.actual_steps = 256;
  }
  for (auto kind : {ScheduleKind::sls, ScheduleKind::load_control}) {
    const auto tr = fd::simulate_schedule(schedule(kind, 8, 256, 8), reqs, 1024);
    CHECK(*std::max_element(tr.running.begin(), tr.running.end()) <= 8);
    CHECK(tr.running[600] == 8);
  }
  CHECK_THROWS_AS(fd::resolve_schedule(schedule(ScheduleKind::sls, 0, 1024, 16)), fd::Error);
  ScheduleKind k;
  REQUIRE(fd::parse_schedule("load-control", &k));
  CHECK(k == ScheduleKind::load_control);
  CHECK(std::string(fd::schedule_name(ScheduleKind::large_batch)) == "large-batch");
  CHECK_FALSE(fd::parse_schedule("fifo", &k));
  LoadPlanner p(schedule(ScheduleKind::sls, 4, 10, 2));
  p.start(5, SeqShape{0, 3});
  CHECK_THROWS_AS(p.start(4, SeqShape{0, 3}), fd::Error);
  CHECK_THROWS_AS(p.start(6, SeqShape{0, 0}), fd::Error);
}

TEST_CASE("fits() agrees with a brute-force search over every future step", "[schedule]") {
  struct Planned {
    int64_t start, last;  // last step it runs (planned end, or where it finished)
    int base;
  };
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    LoadPlanner p(schedule(ScheduleKind::load_control, 16, 50, 5, 1));
    std::vector<Planned> seqs;
    std::vector<fd::SeqTicket> tickets;
    int64_t t = 0;
    for (int i = 0; i < 12; ++i) {
      t += static_cast<int64_t>(rng() % 6);
      const SeqShape s{static_cast<int>(rng() % 20), 1 + static_cast<int>(rng() % 50)};
      tickets.push_back(p.start(t, s));
      seqs.push_back({t, t + s.steps - 1, s.base});
    }
    const int64_t now = t + static_cast<int64_t>(rng() % 4);
    for (size_t i = 0; i < seqs.size(); ++i) {
      // Some end early (EOS), before `now`: finish() comes after their last step.
      if (rng() % 3 != 0 || seqs[i].start >= now) continue;
      const int64_t span = std::min(seqs[i].last, now - 1) - seqs[i].start + 1;
      seqs[i].last = seqs[i].start + static_cast<int64_t>(rng() % static_cast<unsigned>(span));
      p.finish(tickets[i], seqs[i].last);
    }
    const SeqShape shape{static_cast<int>(rng() % 20), 1 + static_cast<int>(rng() % 60)};
    const int64_t limit = 200 + static_cast<int64_t>(rng() % 600);
    const auto load = [&](int64_t tau, int64_t n_new) {
      int64_t w = 0;
      for (const auto& s : seqs)
        if (s.start <= tau && tau <= s.last && tau >= now) w += s.base + tau - s.start + 1;
      if (tau <= now + shape.steps - 1) w += n_new * (shape.base + tau - now + 1);
      return w;
    };
    int64_t brute = 0;
    for (int64_t n = 1; n < 1000; ++n) {
      bool ok = true;
      for (int64_t tau = now; tau < now + 200 && ok; ++tau) ok = load(tau, n) <= limit;
      if (!ok) break;
      brute = n;
    }
    INFO("round " << round);
    CHECK(p.fits(now, shape, limit) == brute);
    CHECK(p.planned_load(now) == load(now, 0));
  }
}
