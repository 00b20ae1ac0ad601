#include "actors/micro_batch.h"

#include <algorithm>
#include <chrono>

#include "caf/all.hpp"
#include "runtime/sampler.h"

namespace fd {
namespace {

using clock = std::chrono::steady_clock;

struct Seq {
  seq_place place;
  gen_request req;
  std::vector<int32_t> tokens;  // prompt, then generated ids
  int32_t n_cached = 0;         // tokens whose K/V the shard holds
  Sampler sampler{SamplingParams{}};
  clock::time_point t0;
  double ttft_ms = 0;
  bytes logits;                 // [sampled][vocab] f32 when req.want_logits
  bool cancelled = false;
  bool homeless = false;        // its shard is gone or leaving: re-place, then re-prefill
};

// The rows of one shard inside a step's payload.
struct Group {
  int32_t shard = 0;
  shard_actor hdl;
  size_t row0 = 0;
  size_t rows = 0;
  std::vector<seq_rows> seqs;
};

struct MbState {
  MicroBatchConfig cfg;
  scheduler_actor scheduler;
  stream_actor stream;
  std::vector<Seq> active;    // sorted by shard while a step runs
  std::vector<Seq> joining;   // admitted, start at the next step
  bool running = false;       // a step or a re-placement is in flight
  bool replacing = false;     // ... and it is a re-placement
  uint64_t step = 0;
  std::vector<Group> groups;
  size_t rows = 0;
  int pending = 0;            // shard replies outstanding for the current layer
  bytes o;                    // [rows][n_heads*head_dim] f32, gathered from the shards
  static inline const char* name = "micro_batch";
};

using self_ptr = micro_batch_actor::stateful_pointer<MbState>;

void finish_seq(self_ptr self, Seq& s, std::string error) {
  auto& st = self->state;
  self->send(s.place.hdl, drop_atom::value, s.place.seq);
  gen_result res;
  res.n_prompt = static_cast<int32_t>(s.req.prompt.size());
  res.tokens.assign(s.tokens.begin() + res.n_prompt, s.tokens.end());
  if (!res.tokens.empty() && res.tokens.back() == st.cfg.eos) res.tokens.pop_back();
  res.ms = std::chrono::duration<double, std::milli>(clock::now() - s.t0).count();
  res.ttft_ms = s.ttft_ms;
  res.error = std::move(error);
  res.logits = std::move(s.logits);
  self->send(st.scheduler, seq_done{s.place.seq, s.place.shard, std::move(res)});
}

void next_step(self_ptr self) {
  self->state.running = false;
  ++self->state.step;  // late replies of the old step are ignored
  self->send(self, step_atom::value);
}

// A shard that timed out or died: its sequences move; the step is retried from its start
// (the shards overwrite the K/V rows they already took for it).
void shard_failed(self_ptr self, uint64_t step, int32_t shard, const caf::error& err) {
  auto& st = self->state;
  if (!st.running || st.step != step) return;
  if (err == caf::sec::request_timeout || err == caf::sec::request_receiver_down) {
    for (auto& s : st.active)
      if (s.place.shard == shard) s.homeless = true;
    self->send(st.scheduler, lost_atom::value, shard);
  } else {
    const std::string msg = "R-part failed: " + self->system().render(err);
    auto it = std::partition(st.active.begin(), st.active.end(),
                             [&](const Seq& s) { return s.place.shard != shard; });
    for (auto f = it; f != st.active.end(); ++f) finish_seq(self, *f, msg);
    st.active.erase(it, st.active.end());
  }
  next_step(self);
}

// The S-part failed: every sequence of the step fails with the same error.
void stream_failed(self_ptr self, uint64_t step, const caf::error& err) {
  auto& st = self->state;
  if (!st.running || st.step != step) return;
  const std::string msg = "S-part failed: " + self->system().render(err);
  for (auto& s : st.active) finish_seq(self, s, msg);
  st.active.clear();
  next_step(self);
}

bool is_finished(const MbState& st, const Seq& s) {
  const auto generated = s.tokens.size() - s.req.prompt.size();
  return s.cancelled || s.tokens.back() == st.cfg.eos ||
         generated >= static_cast<size_t>(s.req.max_new) ||
         s.tokens.size() >= static_cast<size_t>(st.cfg.model.ctx);
}

void finish_step(self_ptr self, const bytes& logits) {
  auto& st = self->state;
  const int vocab = st.cfg.model.vocab;
  const float* l = as<float>(logits);
  std::vector<Seq> keep;
  for (size_t i = 0; i < st.active.size(); ++i) {
    Seq& s = st.active[i];
    s.n_cached = static_cast<int32_t>(s.tokens.size());
    if (!s.cancelled) {
      const float* row = l + i * vocab;
      s.tokens.push_back(s.sampler.sample(row, vocab));
      if (s.req.want_logits)
        s.logits.insert(s.logits.end(), reinterpret_cast<const char*>(row),
                        reinterpret_cast<const char*>(row + vocab));
      if (s.tokens.size() == s.req.prompt.size() + 1)
        s.ttft_ms = std::chrono::duration<double, std::milli>(clock::now() - s.t0).count();
    }
    if (is_finished(st, s))
      finish_seq(self, s, s.cancelled ? "cancelled" : "");
    else
      keep.push_back(std::move(s));
  }
  st.active = std::move(keep);
  next_step(self);
}

void on_output(self_ptr self, uint64_t step, s_output& out);

void dispatch_layer(self_ptr self, uint64_t step, int32_t layer, s_output& out) {
  auto& st = self->state;
  const size_t qw = st.cfg.model.q_width() * sizeof(float);
  const size_t kw = st.cfg.model.kv_width() * sizeof(uint16_t);
  if (out.q.size() != st.rows * qw || out.k.size() != st.rows * kw || out.v.size() != st.rows * kw)
    return stream_failed(self, step, caf::make_error(caf::sec::invalid_argument, "Q/K/V shape"));
  st.o.assign(st.rows * qw, 0);
  st.pending = static_cast<int>(st.groups.size());
  for (const Group& g : st.groups) {
    attn_request req;
    req.step = step;
    req.layer = layer;
    req.seqs = g.seqs;
    req.q.assign(out.q.begin() + g.row0 * qw, out.q.begin() + (g.row0 + g.rows) * qw);
    req.k.assign(out.k.begin() + g.row0 * kw, out.k.begin() + (g.row0 + g.rows) * kw);
    req.v.assign(out.v.begin() + g.row0 * kw, out.v.begin() + (g.row0 + g.rows) * kw);
    const size_t at = g.row0 * qw, len = g.rows * qw;
    const int32_t shard = g.shard;
    self->request(g.hdl, st.cfg.timeout, std::move(req))
        .then(
            [self, step, layer, at, len, shard](attn_reply& r) {
              auto& st = self->state;
              if (!st.running || st.step != step) return;
              if (r.o.size() != len)
                return shard_failed(self, step, shard,
                                    caf::make_error(caf::sec::invalid_argument, "O shape"));
              std::copy(r.o.begin(), r.o.end(), st.o.begin() + at);
              if (--st.pending > 0) return;
              self->request(st.stream, st.cfg.timeout, layer_o{layer, std::move(st.o)})
                  .then([self, step](s_output& next) { on_output(self, step, next); },
                        [self, step](caf::error& e) { stream_failed(self, step, e); });
            },
            [self, step, shard](caf::error& e) { shard_failed(self, step, shard, e); });
  }
}

void on_output(self_ptr self, uint64_t step, s_output& out) {
  auto& st = self->state;
  if (!st.running || st.step != step) return;
  if (out.next_layer >= st.cfg.model.n_layers) {
    if (out.logits.size() != st.active.size() * st.cfg.model.vocab * sizeof(float))
      return stream_failed(self, step, caf::make_error(caf::sec::invalid_argument, "logits"));
    return finish_step(self, out.logits);
  }
  dispatch_layer(self, step, out.next_layer, out);
}

// Lays the rows out shard by shard: each shard receives one contiguous slice per layer.
step_tokens plan_step(MbState& st) {
  std::stable_sort(st.active.begin(), st.active.end(),
                   [](const Seq& a, const Seq& b) { return a.place.shard < b.place.shard; });
  step_tokens in;
  st.groups.clear();
  for (const Seq& s : st.active) {
    if (st.groups.empty() || st.groups.back().shard != s.place.shard)
      st.groups.push_back(Group{s.place.shard, s.place.hdl, in.tokens.size(), 0, {}});
    const int32_t n = static_cast<int32_t>(s.tokens.size()) - s.n_cached;
    st.groups.back().seqs.push_back(seq_rows{s.place.seq, s.n_cached, n});
    st.groups.back().rows += static_cast<size_t>(n);
    for (int32_t i = 0; i < n; ++i) {
      in.tokens.push_back(s.tokens[s.n_cached + i]);
      in.pos.push_back(s.n_cached + i);
    }
    in.logit_rows.push_back(static_cast<int32_t>(in.tokens.size()) - 1);
  }
  st.rows = in.tokens.size();
  return in;
}

// Asks the scheduler for new shards for the homeless sequences; they re-prefill from their
// token history (prompt and generated so far), so no output changes.
void replace_homeless(self_ptr self) {
  auto& st = self->state;
  replace_request req;
  for (const Seq& s : st.active)
    if (s.homeless) req.seqs.push_back(s.place.seq);
  st.running = st.replacing = true;
  const uint64_t step = st.step;
  self->request(st.scheduler, caf::infinite, std::move(req))
      .then(
          [self, step](std::vector<seq_place>& places) {
            auto& st = self->state;
            if (st.step != step) return;
            for (auto& p : places)
              for (auto& s : st.active)
                if (s.place.seq == p.seq) {
                  s.place = p;
                  s.n_cached = 0;
                  s.homeless = false;
                }
            st.replacing = false;
            next_step(self);
          },
          [self, step](caf::error& e) {
            auto& st = self->state;
            if (st.step != step) return;
            const std::string msg = self->system().render(e);
            auto it = std::partition(st.active.begin(), st.active.end(),
                                     [](const Seq& s) { return !s.homeless; });
            for (auto f = it; f != st.active.end(); ++f) finish_seq(self, *f, msg);
            st.active.erase(it, st.active.end());
            st.replacing = false;
            next_step(self);
          });
}

void run_step(self_ptr self) {
  auto& st = self->state;
  if (st.running) return;
  for (auto& s : st.joining) st.active.push_back(std::move(s));
  st.joining.clear();
  auto gone = std::partition(st.active.begin(), st.active.end(),
                             [](const Seq& s) { return !s.cancelled; });
  for (auto it = gone; it != st.active.end(); ++it) finish_seq(self, *it, "cancelled");
  st.active.erase(gone, st.active.end());
  if (std::any_of(st.active.begin(), st.active.end(), [](const Seq& s) { return s.homeless; }))
    return replace_homeless(self);
  if (st.active.empty()) return;
  st.running = true;
  const uint64_t step = st.step;
  self->request(st.stream, st.cfg.timeout, plan_step(st))
      .then([self, step](s_output& out) { on_output(self, step, out); },
            [self, step](caf::error& e) { stream_failed(self, step, e); });
}

micro_batch_actor::behavior_type mb_behavior(self_ptr self, MicroBatchConfig cfg,
                                             scheduler_actor scheduler, stream_actor stream) {
  auto& st = self->state;
  st.cfg = cfg;
  st.scheduler = std::move(scheduler);
  st.stream = std::move(stream);
  return {
      [self](seq_start& start) {
        Seq s;
        s.place = start.place;
        s.tokens = start.req.prompt;
        s.sampler = Sampler(SamplingParams{start.req.temperature, start.req.top_k, start.req.top_p,
                                           start.req.seed});
        s.req = std::move(start.req);
        s.t0 = clock::now();
        self->state.joining.push_back(std::move(s));
        if (!self->state.running) self->send(self, step_atom::value);
      },
      [self](cancel_atom, uint64_t seq) {
        for (auto* v : {&self->state.active, &self->state.joining})
          for (auto& s : *v)
            if (s.place.seq == seq) s.cancelled = true;
        if (!self->state.running) self->send(self, step_atom::value);
      },
      [self](lost_atom, int32_t shard) {
        auto& st = self->state;
        for (auto* v : {&st.active, &st.joining})
          for (auto& s : *v)
            if (s.place.shard == shard) s.homeless = true;
        // A step waiting on the shard would only time out: retry it now, elsewhere.
        const bool involved = std::any_of(st.groups.begin(), st.groups.end(),
                                          [&](const Group& g) { return g.shard == shard; });
        if (st.running && !st.replacing && involved) next_step(self);
        else if (!st.running) self->send(self, step_atom::value);
      },
      [self](step_atom) { run_step(self); },
  };
}

}  // namespace

micro_batch_actor spawn_micro_batch(caf::actor_system& sys, const MicroBatchConfig& cfg,
                                    scheduler_actor scheduler, stream_actor stream) {
  return sys.spawn(mb_behavior, cfg, std::move(scheduler), std::move(stream));
}

}  // namespace fd
