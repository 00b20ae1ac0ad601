#include "runtime/perf_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
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

namespace {

// A one-layer paged fp16 KV-cache holding `seqs` sequences of `seq_tokens` tokens each.
struct RStore {
  std::unique_ptr<KvStore> store;
  size_t seqs = 0;
  kernels::AttnDims dims;
};

RStore make_r_store(const ModelConfig& shape, int seq_tokens, size_t kv_bytes) {
  const int head_dim = shape.head_dim > 0 ? shape.head_dim : shape.dim / std::max(shape.n_heads, 1);
  const int kv_heads = shape.n_kv_heads > 0 ? shape.n_kv_heads : shape.n_heads;
  if (seq_tokens < 1 || head_dim < 1 || kv_heads < 1 || shape.n_heads % kv_heads != 0)
    throw Error("The R-part benchmark needs a positive sequence length and a valid head layout.");
  const size_t row = static_cast<size_t>(kv_heads) * head_dim;  // one token's K
  const size_t token_bytes = 2 * row * sizeof(uint16_t);        // K and V
  RStore r;
  r.seqs = std::max<size_t>(1, (kv_bytes + seq_tokens * token_bytes - 1) / (seq_tokens * token_bytes));
  KvStoreConfig kc;
  kc.n_layers = 1;
  kc.n_kv_heads = kv_heads;
  kc.head_dim = head_dim;
  const size_t blocks = (static_cast<size_t>(seq_tokens) + kc.block_tokens - 1) / kc.block_tokens;
  kc.capacity_bytes = kv_page_bytes(kc) * blocks * r.seqs;
  r.store = std::make_unique<KvStore>(kc);
  std::vector<float> f(static_cast<size_t>(seq_tokens) * row);  // [seq_tokens][row]
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  std::vector<uint16_t> k(f.size()), v(f.size());
  kernels::f32_to_f16(f.data(), k.data(), f.size());
  std::reverse(f.begin(), f.end());
  kernels::f32_to_f16(f.data(), v.data(), f.size());
  for (size_t s = 0; s < r.seqs; ++s) {
    r.store->reserve(s, seq_tokens);
    r.store->append(s, 0, 0, k.data(), v.data(), seq_tokens);
  }
  r.dims.n_heads = shape.n_heads;
  r.dims.n_kv_heads = kv_heads;
  r.dims.head_dim = head_dim;
  return r;
}

}  // namespace

double measure_r_seconds(const ModelConfig& shape, int seq_tokens, size_t kv_bytes, double min_time) {
  const RStore r = make_r_store(shape, seq_tokens, kv_bytes);
  std::vector<float> q(static_cast<size_t>(r.dims.n_heads) * r.dims.head_dim, 0.1f), out(q.size());  // [n_heads*head_dim]
  const auto pass = [&] {
    for (size_t s = 0; s < r.seqs; ++s)
      kernels::attention_f16(q.data(), 1, seq_tokens - 1, r.store->view(s, 0), r.dims, out.data());
  };
  pass();  // warm-up: commits the pages
  return time_median(min_time, pass) / (static_cast<double>(r.seqs) * seq_tokens);
}

double measure_page_first_touch(const ModelConfig& shape, size_t bytes) {
  const int head_dim = shape.head_dim > 0 ? shape.head_dim : shape.dim / std::max(shape.n_heads, 1);
  const int kv_heads = shape.n_kv_heads > 0 ? shape.n_kv_heads : shape.n_heads;
  if (head_dim < 1 || kv_heads < 1) throw Error("The page benchmark needs a valid head layout.");
  KvStoreConfig kc;
  kc.n_layers = 1;
  kc.n_kv_heads = kv_heads;
  kc.head_dim = head_dim;
  kc.capacity_bytes = bytes;
  KvStore store(kc);
  const size_t pages = store.free_pages();
  if (pages == 0) throw Error("The page benchmark's store holds no page.");
  const size_t row = static_cast<size_t>(kv_heads) * head_dim;
  std::vector<uint16_t> kv(row * kc.block_tokens, 0x3c00);  // [block_tokens][row] f16 ones
  const auto fill = [&] {  // one sequence per page
    const auto t0 = Clock::now();
    for (size_t s = 0; s < pages; ++s) {
      store.reserve(s, kc.block_tokens);
      store.append(s, 0, 0, kv.data(), kv.data(), kc.block_tokens);
    }
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    for (size_t s = 0; s < pages; ++s) store.drop(s);
    return t;
  };
  const double fresh = fill();
  const double warm = std::min(fill(), fill());
  return std::max(0.0, fresh - warm) / static_cast<double>(pages);
}

namespace {

struct RunSeq {
  SeqShape shape;
  SeqTicket ticket;
  int worker = 0;
  int done = 0;           // steps it has run
  int64_t reserved = 0;   // tokens reserved on its worker, whole pages
};

struct RunMini {
  explicit RunMini(const ScheduleConfig& c) : planner(c) {}
  LoadPlanner planner;
  std::vector<RunSeq> seqs;     // in the step in flight
  std::vector<RunSeq> joining;  // admitted while it ran: they join at the step after next
  int64_t step = 0;             // steps completed
  bool running = false;
  double ready = 0;             // when its next phase can be sent
  int phase = 0;                // 0, 2, .., 2N: S-parts; 1, 3, .., 2N-1: R-parts of layer phase/2
  int rows = 0;                 // rows of the step in flight
  std::vector<double> load;     // [workers] tokens of the step in flight on each worker
  std::vector<int64_t> reserved;  // [workers] tokens its sequences reserve there
  std::vector<double> touch;      // [workers] seconds of fresh pages in the step in flight
};

class RunReplay {
 public:
  RunReplay(const RunShape& run, const RunCosts& costs) : run_(run), c_(costs) {
    for (size_t i = 0; i < run.requests.size(); ++i) queue_.push_back(i);
    for (int m = 0; m < run.pipeline; ++m) minis_.emplace_back(resolve_schedule(run.schedule));
    reserved_.assign(static_cast<size_t>(run.workers), 0);
    pages_high_.assign(reserved_.size(), 0);
    worker_free_.assign(reserved_.size(), 0.0);
    worker_busy_.assign(reserved_.size(), 0.0);
  }

  RunPrediction play() {
    // The burst arrives before any mini-batch starts: each idle one admits in turn.
    for (size_t m = 0; m < minis_.size(); ++m) start_idle(m, 0.0);
    for (;;) {
      int next = -1;
      for (size_t m = 0; m < minis_.size(); ++m)
        if (minis_[m].running && (next < 0 || minis_[m].ready < minis_[next].ready)) next = int(m);
      if (next < 0) break;
      advance(static_cast<size_t>(next));
    }
    RunPrediction p;
    p.seconds = end_;
    p.tokens = tokens_;
    p.steps = steps_;
    if (end_ > 0) {
      p.tokens_per_s = double(tokens_) / end_;
      p.s_busy = device_busy_ / end_;
      double busy = 0;
      for (double b : worker_busy_) busy += b;
      p.r_busy = busy / double(worker_busy_.size()) / end_;
    }
    if (steps_ > 0) {
      p.t_layer_s = t_sum_ / double(steps_);
      p.r_layer_s = r_sum_ / (double(steps_) * run_.n_layers);
    }
    return p;
  }

 private:
  // Admits queued sequences into mini m while its planner allows, first come first served.
  void admit(RunMini& mini, std::vector<RunSeq>& into) {
    while (!queue_.empty()) {
      const SeqShape& shape = run_.requests[queue_.front()];
      if (mini.planner.quota(mini.step, shape) <= 0) break;
      RunSeq s;
      s.shape = shape;
      s.ticket = mini.planner.start(mini.step, shape);
      // As the scheduler places: the worker with the fewest pages of this mini-batch, then the
      // fewest of all; the first of equals.
      mini.reserved.resize(reserved_.size(), 0);
      s.worker = 0;
      for (size_t w = 1; w < reserved_.size(); ++w)
        if (mini.reserved[w] < mini.reserved[s.worker] ||
            (mini.reserved[w] == mini.reserved[s.worker] && reserved_[w] < reserved_[s.worker]))
          s.worker = int(w);
      const int64_t pt = run_.page_tokens;
      s.reserved = (int64_t(shape.base) + 1 + shape.steps + pt - 1) / pt * pt;
      reserved_[s.worker] += s.reserved;
      mini.reserved[s.worker] += s.reserved;
      into.push_back(s);
      queue_.pop_front();
    }
  }

  void start_idle(size_t m, double now) {
    RunMini& mini = minis_[m];
    if (mini.running) return;
    mini.seqs.insert(mini.seqs.end(), mini.joining.begin(), mini.joining.end());
    mini.joining.clear();
    if (mini.seqs.empty()) admit(mini, mini.seqs);
    if (mini.seqs.empty()) return;
    mini.running = true;
    mini.ready = std::max(mini.ready, now);
    begin_step(mini);
  }

  // Pages in use on worker w, every mini-batch's sequences at their current length, with the
  // sequences of `stepping` one token longer.
  int64_t pages_in_use(size_t w, const RunMini* stepping) const {
    int64_t pages = 0;
    const int64_t pt = run_.page_tokens;
    for (const RunMini& m : minis_)
      for (const RunSeq& s : m.seqs) {
        if (size_t(s.worker) != w) continue;
        const int64_t len = int64_t(s.shape.base) + s.done + (&m == stepping ? 1 : 0);
        if (len > 0) pages += (len + pt - 1) / pt;
      }
    return pages * run_.page_layers;
  }

  void begin_step(RunMini& mini) {
    mini.phase = 0;
    mini.rows = 0;
    mini.load.assign(reserved_.size(), 0.0);
    mini.touch.assign(reserved_.size(), 0.0);
    for (const RunSeq& s : mini.seqs) {
      mini.rows += s.done == 0 ? s.shape.base + 1 : 1;
      mini.load[s.worker] += double(s.shape.base) + s.done + 1;  // its length after the step
    }
    for (size_t w = 0; w < pages_high_.size(); ++w) {
      const int64_t used = pages_in_use(w, &mini);
      if (used <= pages_high_[w]) continue;
      mini.touch[w] = double(used - pages_high_[w]) * c_.page_touch_seconds;
      pages_high_[w] = used;
    }
    ++steps_;
    t_sum_ += c_.spart.layer_seconds(mini.rows);
  }

  void advance(size_t m) {
    RunMini& mini = minis_[m];
    const int n = run_.n_layers;
    const double t = c_.spart.layer_seconds(mini.rows);
    if (mini.phase % 2 == 0) {  // S-part: embed + attn_in, attn_out + attn_in, or attn_out + logits
      const double dur = (mini.phase == 0 || mini.phase == 2 * n) ? t / 2 : t;
      const double start = std::max(mini.ready + c_.s_hop_seconds / 2, device_free_);
      device_free_ = start + dur;
      device_busy_ += dur;
      mini.ready = device_free_ + c_.s_hop_seconds / 2;
    } else {  // R-part of one layer on every worker holding its sequences
      const double arrive = mini.ready + c_.r_hop_seconds / 2;
      double done = arrive, slowest = 0;
      for (size_t w = 0; w < mini.load.size(); ++w) {
        if (mini.load[w] <= 0) continue;
        double dur = c_.r_fixed_seconds + mini.load[w] * c_.r_seconds;
        if (mini.phase == 1) dur += mini.touch[w];  // layer 0 reserves the step's new pages
        const double start = std::max(arrive, worker_free_[w]);
        worker_free_[w] = start + dur;
        worker_busy_[w] += dur;
        done = std::max(done, worker_free_[w]);
        slowest = std::max(slowest, dur);
      }
      r_sum_ += slowest;
      mini.ready = done + c_.r_hop_seconds / 2;
    }
    end_ = std::max(end_, mini.ready);
    if (++mini.phase <= 2 * n) return;
    mini.ready += c_.step_seconds;
    end_step(m);
  }

  void end_step(size_t m) {
    RunMini& mini = minis_[m];
    bool finished = false;
    std::vector<RunSeq> left;
    for (RunSeq& s : mini.seqs) {
      ++tokens_;
      if (++s.done < s.shape.steps) {
        left.push_back(s);
        continue;
      }
      mini.planner.finish(s.ticket, mini.step);
      reserved_[s.worker] -= s.reserved;
      mini.reserved[s.worker] -= s.reserved;
      finished = true;
    }
    mini.seqs = std::move(left);
    ++mini.step;
    mini.seqs.insert(mini.seqs.end(), mini.joining.begin(), mini.joining.end());
    mini.joining.clear();
    if (mini.seqs.empty()) {
      admit(mini, mini.seqs);  // an idle mini-batch starts its admissions at once
    } else {
      admit(mini, mini.joining);
    }
    const double now = mini.ready;
    if (mini.seqs.empty()) {
      mini.running = false;
    } else {
      begin_step(mini);
    }
    // A finished sequence lets the scheduler fill an idle mini-batch.
    if (finished)
      for (size_t o = 0; o < minis_.size(); ++o) start_idle(o, now);
  }

  const RunShape& run_;
  const RunCosts& c_;
  std::deque<size_t> queue_;
  std::vector<RunMini> minis_;
  std::vector<int64_t> reserved_;    // [workers] tokens reserved in whole pages
  std::vector<int64_t> pages_high_;  // [workers] most pages ever in use: beyond, pages are fresh
  std::vector<double> worker_free_;  // [workers] seconds
  std::vector<double> worker_busy_;  // [workers] seconds
  double device_free_ = 0, device_busy_ = 0, end_ = 0, t_sum_ = 0, r_sum_ = 0;
  int64_t tokens_ = 0, steps_ = 0;
};

}  // namespace

RunPrediction predict_run(const RunShape& run, const RunCosts& costs) {
  if (run.n_layers < 1 || run.pipeline < 1 || run.workers < 1 || run.page_tokens < 1)
    throw Error("The run to predict needs positive layers, mini-batches, workers and page size.");
  if (run.requests.empty()) throw Error("The run to predict has no requests.");
  for (const SeqShape& s : run.requests)
    if (s.base < 0 || s.steps < 1) throw Error("Every request of the run must generate at least one token.");
  if (costs.spart.batch.empty()) throw Error("The run to predict needs S-part latencies T(B).");
  if (!(costs.r_seconds > 0)) throw Error("The run to predict needs a positive R-part time per token.");
  RunReplay replay(run, costs);
  return replay.play();
}

}  // namespace fd
