// sls against large-batch on a real (CPU backend) in-process node: the schedule changes when
// sequences start, never what they generate, and sls keeps the R-part load lower.
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <set>

#include "examples/common/bench_schedule.h"
#include "runtime/load_control.h"
#include "tests/test_models.h"

namespace {

std::vector<fd::gen_request> tiny_requests(int n, int max_new, int vocab) {
  std::mt19937 rng(7);
  std::vector<fd::gen_request> out(n);
  for (int i = 0; i < n; ++i) {
    out[i].prompt = {1};
    const int len = 2 + int(rng() % 5);
    while (int(out[i].prompt.size()) < len) out[i].prompt.push_back(3 + int32_t(rng() % (vocab - 3)));
    out[i].max_new = max_new;
    out[i].tag = uint64_t(i);
  }
  return out;
}

}  // namespace

TEST_CASE("sls and large-batch generate the same tokens, sls peaks lower", "[schedule-run]") {
  const fd::ModelConfig mc =
      test_models::config(2, 64, 4, 2, 128, 320, 64);
  auto model = std::make_shared<fd::Model>(fd::make_random_model(mc, 3));
  model->vocab.eos = -1;  // every request runs its max_new steps, so the loads are comparable
  const int batch = 8, steps = 24, n = 2 * batch;
  const auto reqs = tiny_requests(n, steps, mc.vocab);

  fd::LocalOptions opt;
  opt.backend = "cpu";
  opt.shards = 2;
  opt.kv_memory = size_t(8) << 20;
  opt.pipeline = 1;
  opt.scheduled = true;
  opt.schedule.batch = batch;
  opt.schedule.seq_len = steps;
  opt.schedule.interval = 4;
  // The burst of requests reaches the scheduler one message at a time: a window long against
  // a loaded machine's scheduling delays keeps large-batch's first batch from starting partial.
  opt.admission_window = std::chrono::milliseconds(500);

  std::vector<fd::ScheduleRunResult> runs;
  for (auto kind : {fd::ScheduleKind::large_batch, fd::ScheduleKind::sls}) {
    fd::LocalOptions o = opt;
    o.schedule.kind = kind;
    o.schedule = fd::resolve_schedule(o.schedule);
    runs.push_back(fd::run_schedule(model, o, reqs, 2));
  }
  for (const auto& run : runs) {
    INFO(run.schedule);
    REQUIRE(run.results.size() == reqs.size());
    for (const auto& r : run.results) {
      CHECK(r.error.empty());
      CHECK(r.tokens.size() == size_t(steps));
    }
    REQUIRE(!run.steps.empty());
  }
  for (size_t i = 0; i < reqs.size(); ++i) CHECK(runs[0].results[i].tokens == runs[1].results[i].tokens);

  // Every token generated shows up as one sequence-step in the trace.
  for (const auto& run : runs) {
    int64_t seq_steps = 0;
    for (const auto& s : run.steps) seq_steps += s.seqs;
    CHECK(seq_steps == int64_t(n) * steps);
  }
  // The events kept for `bench schedule --trace`: a step span per step, R spans on both shards,
  // S spans on the stream.
  for (const auto& run : runs) {
    std::set<std::string> r_tracks;
    size_t step_spans = 0, s_spans = 0;
    for (const auto& e : run.events) {
      if (e.ph != 'X') continue;
      step_spans += e.name == "step";
      s_spans += e.name == "S";
      if (e.name == "R") r_tracks.insert(e.track);
    }
    CHECK(step_spans == run.steps.size());
    CHECK(s_spans >= run.steps.size());
    CHECK(r_tracks.size() == 2);
  }
  // large-batch: the burst of 2·B requests runs as two full batches, one after the other.
  CHECK(runs[0].steps.size() == size_t(2 * steps));
  for (const auto& s : runs[0].steps) CHECK(s.seqs == batch);
  // sls: once the cold start is over and while requests wait, every step runs exactly the
  // S/F·M sequences of the schedule. A micro-batch that joined a step earlier or later than its
  // planner assumed (the cold start's first one, or one admitted before its mini-batch had begun
  // the next step) showed up as a step with M more or M fewer.
  {
    fd::ScheduleConfig c = opt.schedule;
    c.kind = fd::ScheduleKind::sls;
    c = fd::resolve_schedule(c);
    const int in_flight = steps / c.interval * c.micro_batch;
    REQUIRE(runs[1].steps.size() > size_t(2 * steps));
    for (size_t t = steps; t < size_t(2 * steps); ++t) {
      INFO("sls step " << t);
      CHECK(runs[1].steps[t].seqs == in_flight);
    }
  }
  const fd::ScheduleSummary large = fd::summarize(runs[0]), sls = fd::summarize(runs[1]);
  // large-batch runs B sequences of lengths up to prompt + S - 1 together: at least B·S at its peak.
  CHECK(large.peak_load >= int64_t(batch) * steps);
  CHECK(double(sls.peak_load) < 0.8 * double(large.peak_load));
}
