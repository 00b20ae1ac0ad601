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
  std::string cancelled;        // why it must end at the next step; empty while it runs
  bool homeless = false;        // its shard is gone or leaving: re-place, then re-prefill
};

struct MicroState {
  MicroBatchConfig cfg;
  scheduler_actor scheduler;
  std::vector<Seq> seqs;
  static inline const char* name = "micro_batch";
};

using self_ptr = micro_batch_actor::stateful_pointer<MicroState>;

void finish_seq(self_ptr self, Seq& s, std::string error) {
  auto& st = self->state;
  for (auto& hdl : s.place.hdls) self->send(hdl, drop_atom::value, s.place.seq);
  gen_result res;
  res.n_prompt = static_cast<int32_t>(s.req.prompt.size());
  res.tokens.assign(s.tokens.begin() + res.n_prompt, s.tokens.end());
  if (!res.tokens.empty() && res.tokens.back() == st.cfg.eos) res.tokens.pop_back();
  res.ms = std::chrono::duration<double, std::milli>(clock::now() - s.t0).count();
  res.ttft_ms = s.ttft_ms;
  res.error = std::move(error);
  res.logits = std::move(s.logits);
  self->send(st.scheduler, seq_done{s.place.seq, std::move(res)});
}

// Removes the sequences pred picks, answering each with error.
template <class Pred>
void finish_where(self_ptr self, Pred pred, const std::string& error) {
  auto& v = self->state.seqs;
  auto it = std::stable_partition(v.begin(), v.end(), [&](const Seq& s) { return !pred(s); });
  for (auto f = it; f != v.end(); ++f) finish_seq(self, *f, error);
  v.erase(it, v.end());
}

mb_rows rows_of(const MicroState& st) {
  mb_rows out;
  for (const Seq& s : st.seqs)
    out.seqs.push_back(seq_step{s.place, s.n_cached,
                                std::vector<int32_t>(s.tokens.begin() + s.n_cached, s.tokens.end())});
  return out;
}

bool is_finished(const MicroState& st, const Seq& s) {
  const auto generated = s.tokens.size() - s.req.prompt.size();
  return s.tokens.back() == st.cfg.eos || generated >= static_cast<size_t>(s.req.max_new) ||
         s.tokens.size() >= static_cast<size_t>(st.cfg.model.ctx);
}

// Samples one token per sequence; rows are in the order of the last mb_rows.
void take_logits(self_ptr self, const mb_logits& in) {
  auto& st = self->state;
  const int vocab = st.cfg.model.vocab;
  if (in.logits.size() != st.seqs.size() * vocab * sizeof(float)) {
    finish_where(self, [](const Seq&) { return true; }, "internal error: logits of the wrong shape");
    return;
  }
  const float* l = as<float>(in.logits);
  for (size_t i = 0; i < st.seqs.size(); ++i) {
    Seq& s = st.seqs[i];
    const float* row = l + i * vocab;
    s.n_cached = static_cast<int32_t>(s.tokens.size());
    const int32_t token = s.sampler.sample(row, vocab);
    s.tokens.push_back(token);
    if (s.req.want_logits)
      s.logits.insert(s.logits.end(), reinterpret_cast<const char*>(row),
                      reinterpret_cast<const char*>(row + vocab));
    if (s.tokens.size() == s.req.prompt.size() + 1)
      s.ttft_ms = std::chrono::duration<double, std::milli>(clock::now() - s.t0).count();
    if (s.req.sink && token != st.cfg.eos) self->send(s.req.sink, token_event{s.req.tag, token});
  }
  finish_where(self, [&](const Seq& s) { return is_finished(st, s); }, "");
}

// New shards for the homeless sequences; they re-prefill from their token history (prompt and
// generated so far), so no output changes. Answers the pending rows request when done.
void replace_homeless(self_ptr self, caf::typed_response_promise<mb_rows> rp) {
  auto& st = self->state;
  replace_request req;
  for (const Seq& s : st.seqs)
    if (s.homeless) req.seqs.push_back(s.place.seq);
  std::vector<uint64_t> asked = req.seqs;
  self->request(st.scheduler, caf::infinite, std::move(req))
      .then(
          [self, rp, asked](std::vector<seq_place>& places) mutable {
            for (auto& p : places)
              for (auto& s : self->state.seqs)
                if (s.place.seq == p.seq) {
                  s.place = p;
                  s.n_cached = 0;
                  s.homeless = false;
                }
            const auto was_asked = [&](const Seq& s) {
              return std::find(asked.begin(), asked.end(), s.place.seq) != asked.end();
            };
            finish_where(self, [&](const Seq& s) { return s.homeless && was_asked(s); },
                         "internal error: no new shard for the sequence");
            // Sequences whose shard was lost while this request was in flight get a round of
            // their own.
            for (const Seq& s : self->state.seqs)
              if (s.homeless) return replace_homeless(self, rp);
            rp.deliver(rows_of(self->state));
          },
          [self, rp](caf::error& e) mutable {
            finish_where(self, [](const Seq& s) { return s.homeless; }, self->system().render(e));
            rp.deliver(rows_of(self->state));
          });
}

// The rows of the next step: cancelled sequences end first, homeless ones are re-placed.
caf::result<mb_rows> next_rows(self_ptr self) {
  auto& v0 = self->state.seqs;
  auto gone = std::stable_partition(v0.begin(), v0.end(),
                                    [](const Seq& s) { return s.cancelled.empty(); });
  for (auto f = gone; f != v0.end(); ++f) finish_seq(self, *f, f->cancelled);
  v0.erase(gone, v0.end());
  const auto& v = self->state.seqs;
  if (std::none_of(v.begin(), v.end(), [](const Seq& s) { return s.homeless; }))
    return rows_of(self->state);
  auto rp = self->make_response_promise<mb_rows>();
  replace_homeless(self, rp);
  return rp;
}

micro_batch_actor::behavior_type micro_behavior(self_ptr self, MicroBatchConfig cfg,
                                                scheduler_actor scheduler,
                                                std::vector<seq_start> seqs) {
  auto& st = self->state;
  st.cfg = cfg;
  st.scheduler = std::move(scheduler);
  for (auto& start : seqs) {
    Seq s;
    s.place = start.place;
    s.tokens = start.req.prompt;
    s.sampler = Sampler(SamplingParams{start.req.temperature, start.req.top_k, start.req.top_p,
                                       start.req.seed});
    s.req = std::move(start.req);
    s.t0 = clock::now();
    st.seqs.push_back(std::move(s));
  }
  return {
      [self](rows_atom) { return next_rows(self); },
      // One round trip per step: the answer to the logits is already the next step's rows.
      [self](const mb_logits& in) {
        take_logits(self, in);
        return next_rows(self);
      },
      [self](cancel_atom, uint64_t seq, const std::string& why) {
        for (auto& s : self->state.seqs)
          if (s.place.seq == seq && s.cancelled.empty()) s.cancelled = why;
      },
      [self](lost_atom, int32_t shard) {
        for (auto& s : self->state.seqs)
          if (s.place.on(shard)) s.homeless = true;
      },
  };
}

}  // namespace

micro_batch_actor spawn_micro_batch(caf::actor_system& sys, const MicroBatchConfig& cfg,
                                    scheduler_actor scheduler, std::vector<seq_start> seqs) {
  return sys.spawn(micro_behavior, cfg, std::move(scheduler), std::move(seqs));
}

}  // namespace fd
