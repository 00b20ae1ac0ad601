#include "actors/mini_batch.h"

#include <algorithm>

#include "actors/trace_packed.h"
#include "caf/all.hpp"

namespace fd {
namespace {

// Where one sequence's rows sit in the step.
struct RowRef {
  size_t micro = 0;  // index into MiniState::micros
  size_t index = 0;  // the sequence's index in that micro-batch's mb_rows
  seq_step* step = nullptr;
  size_t row0 = 0;   // its first row in the step's payload
};

// What one shard of one R-group receives per layer: its sequences' rows, its group's heads.
struct Bucket {
  int32_t group = 0;
  int32_t shard = 0;
  shard_actor hdl;
  std::vector<seq_rows> seqs;
  std::vector<size_t> row0;  // [seqs] first row of each in the step's payload
  size_t rows = 0;
};

struct MiniState {
  MiniBatchConfig cfg;
  scheduler_actor scheduler;
  stream_actor stream;
  std::vector<micro_batch_actor> micros;  // stepping
  std::vector<micro_batch_actor> joining; // join at the next step
  // The next step's rows of every micro-batch, when their answers to the logits brought them:
  // that step then starts without asking for rows. Empty when it must ask.
  std::vector<mb_rows> next_rows_of;      // [micros]
  bool running = false;
  uint64_t step = 0;
  // Step reports the scheduler has not yet answered (admitted_atom), and whether a step waits
  // for them (see run_step).
  int reports_out = 0;
  bool step_deferred = false;
  // The step in flight.
  std::vector<mb_rows> rows_of;           // [micros]
  std::vector<RowRef> order;              // sequences in row order
  std::vector<Bucket> buckets;
  size_t rows = 0;
  int pending = 0;                        // outstanding replies of the current phase
  bytes o;                                // [rows][n_heads*head_dim] f32 gathered from shards
  // Shards known to be gone. CAF drops a message to a dead remote actor without an error, so a
  // request to one would only time out: none is sent.
  std::vector<int32_t> lost;
  // Tracing, only while a console subscribes.
  bool tracing = false;
  std::vector<PackedSpan> spans;          // recorded since the last send to the scheduler
  bool flush_pending = false;             // a tick_atom will send them
  int64_t step_t0 = 0, phase_t0 = 0;      // µs, trace_now_us(); 0: not traced from its start
  int64_t s_us = 0, r_us = 0, comm_us = 0, max_compute_us = 0;
  static inline const char* name = "mini_batch";
};

using self_ptr = mini_batch_actor::stateful_pointer<MiniState>;

void flush_trace(self_ptr self) {
  auto& st = self->state;
  if (st.spans.empty()) return;
  trace_packed p;
  p.spans = to_bytes(st.spans.data(), st.spans.size());
  st.spans.clear();
  self->send(st.scheduler, std::move(p));
}

// Records one span (args: counts, and microseconds for the *_ms arguments, see SpanKind); they
// travel together at most every kTraceFlush.
void span(self_ptr self, SpanKind kind, int32_t actor, int64_t t0, int64_t t1,
          std::initializer_list<int64_t> args) {
  auto& st = self->state;
  PackedSpan& s = st.spans.emplace_back();
  s.ts_us = t0;
  s.dur_us = static_cast<int32_t>(std::max<int64_t>(0, t1 - t0));
  s.actor = actor;
  s.kind = static_cast<uint8_t>(kind);
  int i = 0;
  for (int64_t a : args)
    if (i < kSpanArgs) s.args[i++] = static_cast<int32_t>(std::min<int64_t>(a, INT32_MAX));
  if (st.spans.size() >= kTraceFlushSpans) {
    flush_trace(self);
  } else if (!st.flush_pending) {
    st.flush_pending = true;
    self->delayed_send(self, kTraceFlush, tick_atom::value);
  }
}

// The S-part answered: a span on the stream's track.
void trace_s(self_ptr self) {
  auto& st = self->state;
  if (!st.tracing || st.phase_t0 == 0) return;
  const int64_t now = trace_now_us();
  span(self, SpanKind::s, st.cfg.index, st.phase_t0, now, {int64_t(st.rows)});
  st.s_us += now - st.phase_t0;
}

// Every shard answered for a layer: the R phase's wall time splits into compute and communication.
void trace_r_done(MiniState& st) {
  if (!st.tracing || st.phase_t0 == 0) return;
  const int64_t wall = trace_now_us() - st.phase_t0;
  st.r_us += wall;
  st.comm_us += std::max<int64_t>(0, wall - st.max_compute_us);
  st.max_compute_us = 0;
}

void trace_step_end(self_ptr self) {
  auto& st = self->state;
  if (!st.tracing || st.step_t0 == 0) return;
  int64_t kv_tokens = 0;  // the step's R-part load W: sum of its sequences' lengths after it
  for (const RowRef& r : st.order) kv_tokens += r.step->pos0 + int64_t(r.step->tokens.size());
  span(self, SpanKind::step, st.cfg.index, st.step_t0, trace_now_us(),
       {int64_t(st.rows), int64_t(st.order.size()), int64_t(st.micros.size()), st.s_us, st.r_us,
        st.comm_us, kv_tokens});
}

void on_output(self_ptr self, uint64_t step, s_output& out);

// Rows kept from the logits answers stay valid only for a step that follows a complete one.
void next_step(self_ptr self, std::vector<mb_rows> rows = {}) {
  self->state.next_rows_of = std::move(rows);
  self->state.running = false;
  ++self->state.step;  // late replies of the old step are ignored
  self->send(self, step_atom::value);
}

bool current(const MiniState& st, uint64_t step) { return st.running && st.step == step; }

void tell_lost(self_ptr self, int32_t shard) {
  for (auto& m : self->state.micros) self->send(m, lost_atom::value, shard);
  for (auto& m : self->state.joining) self->send(m, lost_atom::value, shard);
}

// A shard that timed out or died: its sequences move and the step is retried from its start
// (shards overwrite the K/V rows they already took for it). Other errors fail the sequences.
void shard_failed(self_ptr self, uint64_t step, int32_t shard, const caf::error& err) {
  auto& st = self->state;
  if (!current(st, step)) return;
  if (err == caf::sec::request_timeout || err == caf::sec::request_receiver_down) {
    tell_lost(self, shard);  // before their next rows request, as sends keep their order
    self->send(st.scheduler, lost_atom::value, shard);
  } else {
    const std::string why = "R-part failed: " + self->system().render(err);
    for (const RowRef& r : st.order)
      if (r.step->place.on(shard))
        self->send(st.micros[r.micro], cancel_atom::value, r.step->place.seq, why);
  }
  next_step(self);
}

// The S-part failed: every sequence of the step fails.
void stream_failed(self_ptr self, uint64_t step, const caf::error& err) {
  auto& st = self->state;
  if (!current(st, step)) return;
  const std::string why = "S-part failed: " + self->system().render(err);
  for (const RowRef& r : st.order)
    self->send(st.micros[r.micro], cancel_atom::value, r.step->place.seq, why);
  next_step(self);
}

void scatter_logits(self_ptr self, uint64_t step, const bytes& logits) {
  auto& st = self->state;
  const size_t row_bytes = st.cfg.model.vocab * sizeof(float);
  std::vector<mb_logits> per(st.micros.size());
  for (size_t m = 0; m < st.micros.size(); ++m)
    per[m].logits.resize(st.rows_of[m].seqs.size() * row_bytes);
  for (size_t i = 0; i < st.order.size(); ++i) {
    const RowRef& r = st.order[i];
    std::copy_n(logits.begin() + i * row_bytes, row_bytes,
                per[r.micro].logits.begin() + r.index * row_bytes);
  }
  st.pending = static_cast<int>(st.micros.size());
  auto next = std::make_shared<std::vector<mb_rows>>(st.micros.size());
  auto all_answered = std::make_shared<bool>(true);
  for (size_t m = 0; m < st.micros.size(); ++m) {
    auto done = [self, step, next, all_answered] {
      auto& st = self->state;
      if (!current(st, step) || --st.pending > 0) return;
      trace_step_end(self);
      // The next step is queued before the report leaves: a micro-batch the scheduler admits on
      // the report then always joins the step after it, as its planner assumes.
      next_step(self, *all_answered ? std::move(*next) : std::vector<mb_rows>{});
      self->send(st.scheduler, step_atom::value, static_cast<int32_t>(st.cfg.index));
      ++st.reports_out;
    };
    self->request(st.micros[m], st.cfg.timeout, std::move(per[m]))
        .then(
            [done, next, m](mb_rows& rows) {
              (*next)[m] = std::move(rows);
              done();
            },
            [done, all_answered](caf::error&) {
              *all_answered = false;
              done();
            });
  }
}

// Copies columns [c0, c0 + width) of the rows of each sequence in b, packed.
template <class T>
void gather(const bytes& src, size_t row_width, const Bucket& b, size_t c0, size_t width,
            bytes& dst) {
  dst.clear();  // appended row by row: resize() would zero every byte first
  dst.reserve(b.rows * width * sizeof(T));
  const T* in = as<T>(src);
  for (size_t i = 0; i < b.seqs.size(); ++i)
    for (int32_t r = 0; r < b.seqs[i].n; ++r) {
      const auto* row = reinterpret_cast<const char*>(in + (b.row0[i] + r) * row_width + c0);
      dst.insert(dst.end(), row, row + width * sizeof(T));
    }
}

// A bucket that holds every row of the step, in order, and every head: its Q/K/V and O can move
// whole instead of being gathered and scattered (one shard serving the mini-batch).
bool whole(const MiniState& st, const Bucket& b, const r_group& g, const ModelConfig& m) {
  if (b.rows != st.rows || g.head0 != 0 || g.heads != m.n_heads || g.kv_head0 != 0 || g.kv_heads != m.n_kv_heads)
    return false;
  size_t next = 0;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    if (b.row0[i] != next) return false;
    next += static_cast<size_t>(b.seqs[i].n);
  }
  return true;
}

void dispatch_layer(self_ptr self, uint64_t step, int32_t layer, s_output& out) {
  auto& st = self->state;
  const ModelConfig& m = st.cfg.model;
  const size_t hd = m.head_dim, qw = m.q_width(), kw = m.kv_width();
  if (out.q.size() != st.rows * qw * sizeof(float) ||
      out.k.size() != st.rows * kw * sizeof(uint16_t) || out.v.size() != st.rows * kw * sizeof(uint16_t))
    return stream_failed(self, step, caf::make_error(caf::sec::invalid_argument, "Q/K/V shape"));
  for (const Bucket& b : st.buckets)
    if (std::find(st.lost.begin(), st.lost.end(), b.shard) != st.lost.end())
      return shard_failed(self, step, b.shard, caf::make_error(caf::sec::request_receiver_down));
  const auto active = [&](const Bucket& b) {
    const r_group& g = st.cfg.groups[b.group];
    return layer >= g.layer0 && layer < g.layer0 + g.layers;
  };
  const auto first = std::find_if(st.buckets.begin(), st.buckets.end(), active);
  const bool moved = first != st.buckets.end() && std::count_if(first, st.buckets.end(), active) == 1 &&
                     whole(st, *first, st.cfg.groups[first->group], m);
  if (!moved) st.o.assign(st.rows * qw * sizeof(float), 0);
  st.pending = 0;
  if (st.tracing) st.phase_t0 = trace_now_us();
  for (const Bucket& b : st.buckets) {
    if (!active(b)) continue;
    const r_group& g = st.cfg.groups[b.group];
    ++st.pending;
    attn_request req;
    req.step = step;
    req.layer = layer - g.layer0;
    req.seqs = b.seqs;
    if (moved) {
      req.q = std::move(out.q);
      req.k = std::move(out.k);
      req.v = std::move(out.v);
    } else {
      gather<float>(out.q, qw, b, g.head0 * hd, g.heads * hd, req.q);
      gather<uint16_t>(out.k, kw, b, g.kv_head0 * hd, g.kv_heads * hd, req.k);
      gather<uint16_t>(out.v, kw, b, g.kv_head0 * hd, g.kv_heads * hd, req.v);
    }
    const size_t c0 = g.head0 * hd, width = g.heads * hd;
    const int32_t shard = b.shard;
    const Bucket* bp = &b;
    self->request(b.hdl, st.cfg.timeout, std::move(req))
        .then(
            [self, step, layer, shard, bp, c0, width, qw, moved](attn_reply& r) {
              auto& st = self->state;
              if (!current(st, step)) return;
              if (r.o.size() != bp->rows * width * sizeof(float))
                return shard_failed(self, step, shard,
                                    caf::make_error(caf::sec::invalid_argument, "O shape"));
              if (moved) {
                st.o = std::move(r.o);
              } else {
                const float* in = as<float>(r.o);
                float* o = as<float>(st.o);
                for (size_t i = 0; i < bp->seqs.size(); ++i)
                  for (int32_t row = 0; row < bp->seqs[i].n; ++row, in += width)
                    std::copy_n(in, width, o + (bp->row0[i] + row) * qw + c0);
              }
              if (st.tracing && st.phase_t0 != 0) {
                // The shard computed just before its reply came back: a request of the other
                // mini-batch may have held it before, so the round trip's start says nothing
                // about when it began (its middle would overlap that request's span).
                const int64_t now = trace_now_us(), rtt = now - st.phase_t0;
                const int64_t start = std::max(st.phase_t0, now - r.compute_us);
                span(self, SpanKind::r, shard, start, start + r.compute_us, {layer, rtt});
                st.max_compute_us = std::max(st.max_compute_us, r.compute_us);
              }
              if (--st.pending > 0) return;
              trace_r_done(st);
              if (st.tracing) st.phase_t0 = trace_now_us();
              self->request(st.stream, st.cfg.timeout, layer_o{layer, std::move(st.o)})
                  .then([self, step](s_output& next) { on_output(self, step, next); },
                        [self, step](caf::error& e) { stream_failed(self, step, e); });
            },
            [self, step, shard](caf::error& e) { shard_failed(self, step, shard, e); });
  }
}

void on_output(self_ptr self, uint64_t step, s_output& out) {
  auto& st = self->state;
  if (!current(st, step)) return;
  trace_s(self);
  if (out.next_layer >= st.cfg.model.n_layers) {
    if (out.logits.size() != st.order.size() * st.cfg.model.vocab * sizeof(float))
      return stream_failed(self, step, caf::make_error(caf::sec::invalid_argument, "logits"));
    return scatter_logits(self, step, out.logits);
  }
  dispatch_layer(self, step, out.next_layer, out);
}

// Lays out the rows of all micro-batches and, per R-group, which shard gets which sequences:
// one attention message per shard and layer, however many micro-batches its sequences belong to.
step_tokens plan_step(MiniState& st) {
  st.order.clear();
  st.buckets.clear();
  step_tokens in;
  for (size_t m = 0; m < st.rows_of.size(); ++m)
    for (size_t i = 0; i < st.rows_of[m].seqs.size(); ++i) {
      seq_step& s = st.rows_of[m].seqs[i];
      const size_t row0 = in.tokens.size();
      st.order.push_back(RowRef{m, i, &s, row0});
      const int32_t n = static_cast<int32_t>(s.tokens.size());
      for (int32_t t = 0; t < n; ++t) {
        in.tokens.push_back(s.tokens[t]);
        in.pos.push_back(s.pos0 + t);
      }
      in.logit_rows.push_back(static_cast<int32_t>(in.tokens.size()) - 1);
      for (size_t g = 0; g < st.cfg.groups.size() && g < s.place.shards.size(); ++g) {
        auto b = std::find_if(st.buckets.begin(), st.buckets.end(), [&](const Bucket& x) {
          return x.group == static_cast<int32_t>(g) && x.shard == s.place.shards[g];
        });
        if (b == st.buckets.end())
          b = st.buckets.insert(st.buckets.end(), Bucket{static_cast<int32_t>(g), s.place.shards[g],
                                                         s.place.hdls[g], {}, {}, 0});
        b->seqs.push_back(seq_rows{s.place.seq, s.pos0, n});
        b->row0.push_back(row0);
        b->rows += static_cast<size_t>(n);
      }
    }
  st.rows = in.tokens.size();
  return in;
}

void start_layers(self_ptr self, uint64_t step) {
  auto& st = self->state;
  // A micro-batch without rows has no sequence left: it is done.
  std::vector<micro_batch_actor> micros;
  std::vector<mb_rows> rows_of;
  for (size_t m = 0; m < st.micros.size(); ++m) {
    if (st.rows_of[m].seqs.empty()) {
      // Not exit_reason::normal: CAF's default exit handler ignores that reason.
      caf::anon_send_exit(st.micros[m], caf::exit_reason::user_shutdown);
      continue;
    }
    micros.push_back(std::move(st.micros[m]));
    rows_of.push_back(std::move(st.rows_of[m]));
  }
  st.micros = std::move(micros);
  st.rows_of = std::move(rows_of);
  step_tokens in = plan_step(st);
  if (in.tokens.empty()) {
    st.running = false;
    // A micro-batch added while this step asked for rows waits in `joining`: start it now, as
    // no step end will.
    if (!st.joining.empty()) self->send(self, step_atom::value);
    return;
  }
  if (st.tracing) st.phase_t0 = trace_now_us();
  self->request(st.stream, st.cfg.timeout, std::move(in))
      .then([self, step](s_output& out) { on_output(self, step, out); },
            [self, step](caf::error& e) { stream_failed(self, step, e); });
}

// A step starts with every micro-batch's rows: those that came with the last step's logits, and
// for the others (all of them after a failed step, and those joining) a rows request.
void run_step(self_ptr self) {
  auto& st = self->state;
  if (st.running) return;
  // The micro-batches the scheduler admits on a step's report join the step after the next one
  // (the next one has begun by then), as its planner counts them; one that arrived a step later,
  // behind a busy scheduler, ran a step late, and the schedule's load was off by M for a step or
  // two (1 in about 65 runs of the sls test beside two attention benchmarks). So a step waits
  // until the report of the step two before it is answered: only when the scheduler lags by more
  // than a whole step.
  if (st.reports_out > 1) {
    st.step_deferred = true;
    return;
  }
  const size_t known = st.next_rows_of.size() == st.micros.size() ? st.micros.size() : 0;
  st.rows_of = std::move(st.next_rows_of);
  st.next_rows_of.clear();
  for (auto& m : st.joining) st.micros.push_back(std::move(m));
  st.joining.clear();
  if (st.micros.empty()) return;
  st.running = true;
  const uint64_t step = st.step;
  if (st.tracing) {
    st.step_t0 = trace_now_us();
    st.s_us = st.r_us = st.comm_us = st.max_compute_us = 0;
  }
  if (known == 0) st.rows_of.clear();  // all kept, or none: then every micro-batch is asked
  st.rows_of.resize(st.micros.size());
  st.pending = static_cast<int>(st.micros.size() - known);
  if (st.pending == 0) return start_layers(self, step);
  for (size_t m = known; m < st.micros.size(); ++m)
    self->request(st.micros[m], caf::infinite, rows_atom::value)
        .then(
            [self, step, m](mb_rows& rows) {
              auto& st = self->state;
              if (!current(st, step)) return;
              st.rows_of[m] = std::move(rows);
              if (--st.pending == 0) start_layers(self, step);
            },
            [self, step, m](caf::error&) {
              auto& st = self->state;
              if (!current(st, step)) return;
              st.rows_of[m] = mb_rows{};
              if (--st.pending == 0) start_layers(self, step);
            });
}

mini_batch_actor::behavior_type mini_behavior(self_ptr self, MiniBatchConfig cfg,
                                              scheduler_actor scheduler, stream_actor stream) {
  auto& st = self->state;
  st.cfg = cfg;
  st.scheduler = std::move(scheduler);
  st.stream = std::move(stream);
  // The micro-batches are not linked to anyone: they end with their mini-batch (which ends with
  // the scheduler), or they would keep the actor system, and the process, from shutting down.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    if (!msg.reason) return;
    for (auto* v : {&self->state.micros, &self->state.joining})
      for (auto& m : *v) self->send_exit(m, msg.reason);
    self->quit(msg.reason);
  });
  return {
      [self](add_atom, micro_batch_actor m) {
        self->state.joining.push_back(std::move(m));
        if (!self->state.running) self->send(self, step_atom::value);
      },
      [self](lost_atom, int32_t shard) {
        auto& st = self->state;
        st.next_rows_of.clear();  // they may place sequences on the lost shard
        tell_lost(self, shard);
        if (std::find(st.lost.begin(), st.lost.end(), shard) == st.lost.end())
          st.lost.push_back(shard);
        // A step waiting on the shard, or about to send to it after the S-part, would only time
        // out: retry it now, elsewhere.
        const bool waiting = st.running &&
                             std::any_of(st.buckets.begin(), st.buckets.end(),
                                         [&](const Bucket& b) { return b.shard == shard; });
        if (waiting) next_step(self);
      },
      [self](subscribe_atom, bool on) {
        auto& st = self->state;
        st.tracing = on;
        st.spans.clear();
        st.step_t0 = st.phase_t0 = 0;  // a step or phase in flight is not traced
      },
      [self](tick_atom) {
        self->state.flush_pending = false;
        if (self->state.tracing) flush_trace(self);
      },
      [self](admitted_atom) {
        auto& st = self->state;
        --st.reports_out;
        if (st.step_deferred) {
          st.step_deferred = false;
          run_step(self);
        }
      },
      [self](step_atom) { run_step(self); },
  };
}

}  // namespace

mini_batch_actor spawn_mini_batch(caf::actor_system& sys, const MiniBatchConfig& cfg,
                                  scheduler_actor scheduler, stream_actor stream) {
  return sys.spawn(mini_behavior, cfg, std::move(scheduler), std::move(stream));
}

}  // namespace fd
