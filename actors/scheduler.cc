#include "actors/scheduler.h"

#include <algorithm>
#include <deque>
#include <iostream>
#include <map>
#include <unordered_map>

#include "actors/trace_packed.h"
#include "caf/all.hpp"

namespace fd {
namespace {

using clock = std::chrono::steady_clock;

struct ShardEntry {
  shard_info info;
  uint64_t used_pages = 0;  // pages promised to the sequences placed here
  bool leaving = false;
  std::map<size_t, uint64_t> mini_pages;  // used_pages per mini-batch
};

struct Live {
  caf::typed_response_promise<gen_result> promise;
  gen_request req;          // kept until the sequence enters a micro-batch
  std::vector<int32_t> shards;  // [groups] where its KV-cache lives; empty while queued
  uint64_t tokens = 0;      // the most tokens the sequence can hold
  clock::time_point since;  // when it was asked for
  caf::actor_addr client;   // who asked; its death cancels the sequence
  micro_batch_actor micro;  // null while queued
  size_t mini = 0;          // index of its mini-batch
  uint64_t tag = 0;         // the client's name for it
  SeqTicket ticket;         // its planned load, under a schedule
};

struct Leave {
  caf::typed_response_promise<bool> promise;
  std::vector<int32_t> shards;
  std::vector<uint64_t> seqs;  // live on those shards when the leave began
};

struct Replace {
  caf::typed_response_promise<std::vector<seq_place>> promise;
  std::vector<uint64_t> seqs;
  clock::time_point since;
};

struct SchedState {
  SchedulerConfig cfg;
  std::map<int32_t, ShardEntry> shards;
  int32_t next_shard = 0;
  std::vector<mini_batch_actor> minis;
  std::vector<size_t> mini_seqs;  // [minis] live sequences in each
  std::vector<LoadPlanner> planners;  // [minis] under a schedule
  std::vector<int64_t> mini_step;     // [minis] steps each has completed
  uint64_t next_seq = 1;
  std::unordered_map<uint64_t, Live> live;
  std::deque<uint64_t> queue;  // admitted sequences waiting for room in the batch or a shard
  size_t in_batch = 0;
  std::vector<Leave> leaves;
  std::vector<Replace> replaces;
  bool said_waiting = false;
  // Whether some shard served at the last change of the shards, and since when none has: only
  // that time counts against --shard-wait for queued sequences, not waiting for room in the batch.
  bool had_serving = false;
  clock::time_point shards_gone = clock::now();
  bool admit_pending = false;  // a deferred admission into an idle mini-batch is on its way
  std::vector<trace_sink> subscribers;  // tracing consoles
  std::ostream no_log{nullptr};
  static inline const char* name = "scheduler";
};

using self_ptr = scheduler_actor::stateful_pointer<SchedState>;

// Where lines about the cluster's shape go: stderr, or nowhere when the scheduler runs quietly.
std::ostream& log(SchedState& st) { return st.cfg.log ? std::cerr : st.no_log; }

}  // namespace

bool better_place(const ShardLoad& a, const ShardLoad& b) {
  if (a.mini_pages != b.mini_pages) return a.mini_pages < b.mini_pages;
  if (a.used_pages != b.used_pages) return a.used_pages < b.used_pages;
  return a.free_tokens > b.free_tokens;
}

namespace {

uint64_t pages_for(uint64_t tokens, int32_t page_tokens) {
  return (tokens + page_tokens - 1) / page_tokens;
}

// The serving shard of R-group g that can hold `tokens` and is the best place (better_place) for
// a sequence of mini-batch `mini`; or -1.
int32_t best_shard(const SchedState& st, int32_t g, uint64_t tokens, size_t mini) {
  int32_t best = -1;
  ShardLoad best_load;
  for (auto& [id, e] : st.shards) {
    if (e.leaving || e.info.group != g) continue;
    const uint64_t need = pages_for(tokens, e.info.page_tokens);
    if (e.used_pages + need > e.info.pages) continue;
    const auto m = e.mini_pages.find(mini);
    const ShardLoad load{m == e.mini_pages.end() ? 0 : m->second, e.used_pages,
                         (e.info.pages - e.used_pages) * e.info.page_tokens};
    if (best < 0 || better_place(load, best_load)) {
      best = id;
      best_load = load;
    }
  }
  return best;
}

bool serving(const SchedState& st, int32_t shard) {
  auto it = st.shards.find(shard);
  return it != st.shards.end() && !it->second.leaving;
}

void release(SchedState& st, Live& l) {
  for (int32_t shard : l.shards) {
    auto it = st.shards.find(shard);
    if (it != st.shards.end()) {
      const uint64_t pages = pages_for(l.tokens, it->second.info.page_tokens);
      it->second.used_pages -= pages;
      it->second.mini_pages[l.mini] -= pages;
    }
  }
  l.shards.clear();
}

// One shard per R-group, keeping the ones the sequence has where they still serve; all or
// nothing. On success l.shards is set and the pages are counted.
bool place(SchedState& st, Live& l) {
  std::vector<int32_t> chosen(st.cfg.groups);
  for (int32_t g = 0; g < st.cfg.groups; ++g) {
    const bool keep = static_cast<size_t>(g) < l.shards.size() && serving(st, l.shards[g]);
    chosen[g] = keep ? l.shards[g] : best_shard(st, g, l.tokens, l.mini);
    if (chosen[g] < 0) return false;
  }
  release(st, l);
  for (int32_t shard : chosen) {
    auto& e = st.shards[shard];
    const uint64_t pages = pages_for(l.tokens, e.info.page_tokens);
    e.used_pages += pages;
    e.mini_pages[l.mini] += pages;
  }
  l.shards = std::move(chosen);
  return true;
}

seq_place place_of(const SchedState& st, uint64_t seq, const Live& l) {
  seq_place p;
  p.seq = seq;
  p.shards = l.shards;
  for (int32_t shard : l.shards) p.hdls.push_back(st.shards.at(shard).info.hdl);
  return p;
}

// Whether every R-group has a serving shard that could hold the sequence, were it empty.
bool could_fit(const SchedState& st, uint64_t tokens) {
  for (int32_t g = 0; g < st.cfg.groups; ++g) {
    bool any = false;
    for (auto& [id, e] : st.shards)
      any |= !e.leaving && e.info.group == g && pages_for(tokens, e.info.page_tokens) <= e.info.pages;
    if (!any) return false;
  }
  return true;
}

// Whether every R-group has a serving shard.
bool has_serving_shard(const SchedState& st) {
  for (int32_t g = 0; g < st.cfg.groups; ++g)
    if (std::none_of(st.shards.begin(), st.shards.end(), [&](const auto& kv) {
          return !kv.second.leaving && kv.second.info.group == g;
        }))
      return false;
  return true;
}

// Call after the set of serving shards changed: starts the --shard-wait clock when the last went.
void note_shards(SchedState& st) {
  const bool serving_now = has_serving_shard(st);
  if (st.had_serving && !serving_now) st.shards_gone = clock::now();
  st.had_serving = serving_now;
}

// Whether a queued sequence has waited longer than --shard-wait for a shard to serve it.
bool waited_too_long(const SchedState& st, const Live& l, clock::time_point now) {
  if (st.had_serving) return false;  // it waits for room, which frees as sequences finish
  return now - std::max(l.since, st.shards_gone) > st.cfg.shard_wait;
}

void fail(self_ptr self, uint64_t seq, const std::string& why) {
  auto& st = self->state;
  auto it = st.live.find(seq);
  if (it == st.live.end()) return;
  gen_result r;
  r.n_prompt = static_cast<int32_t>(it->second.req.prompt.size());
  r.error = why;
  release(st, it->second);
  it->second.promise.deliver(std::move(r));
  st.live.erase(it);
}

SeqShape shape_of(const gen_request& req) {
  return SeqShape{static_cast<int>(req.prompt.size()) - 1, std::max(1, req.max_new)};
}

// Forms one micro-batch of the queued sequences that may start now, first in first served, and
// hands it to a mini-batch: without a schedule every one that fits, to the mini-batch with the
// fewest sequences; with one, as many as that mini-batch's planner allows at its current step
// (target < 0: any idle mini-batch).
// Says once, while no shard serves, that work waits for one to join.
void say_waiting(SchedState& st) {
  if (has_serving_shard(st) || st.said_waiting) return;
  log(st) << "scheduler: waiting for R-worker shards to join (up to "
          << std::chrono::duration_cast<std::chrono::seconds>(st.cfg.shard_wait).count()
          << " s, --shard-wait)\n";
  st.said_waiting = true;
}

// The mini-batch with the fewest sequences: the one an admission without a target fills.
size_t least_loaded_mini(const SchedState& st) {
  return static_cast<size_t>(std::min_element(st.mini_seqs.begin(), st.mini_seqs.end()) -
                             st.mini_seqs.begin());
}

// The step a micro-batch admitted now runs first, numbered as mini_step counts them (step i runs
// after i completed ones), which is how its planner must see it: a running mini-batch has begun
// step mini_step before its report of the previous one arrives here, so the newcomer joins the
// step after; an idle one starts step mini_step with it. Planning both at mini_step made the first
// micro-batch of a cold start run a step earlier than planned relative to the later ones, so their
// replacements came a step late (B - M running for that step) or a step early (B + M).
int64_t join_step(const SchedState& st, size_t mini) {
  return st.mini_step[mini] + (st.mini_seqs[mini] > 0 ? 1 : 0);
}

// Whether an idle mini-batch should wait for more requests before it starts (admission_window).
bool batch_filling(const SchedState& st) {
  if (st.queue.empty()) return false;
  const size_t mini = least_loaded_mini(st);
  if (st.mini_seqs[mini] > 0) return false;
  const auto it = st.live.find(st.queue.front());
  if (it == st.live.end() || clock::now() - it->second.since >= st.cfg.admission_window) return false;
  const int quota = st.planners[mini].quota(join_step(st, mini), shape_of(it->second.req));
  const size_t room = static_cast<size_t>(st.cfg.max_batch) - std::min<size_t>(st.in_batch, st.cfg.max_batch);
  return st.queue.size() < std::min<size_t>(room, static_cast<size_t>(std::max(quota, 0)));
}

void admit_queued(self_ptr self, int target = -1) {
  auto& st = self->state;
  size_t mini = least_loaded_mini(st);
  if (st.cfg.scheduled) {
    if (target >= 0) mini = static_cast<size_t>(target);
    else if (st.mini_seqs[mini] > 0) return;  // running mini-batches admit at their steps
  }
  std::vector<seq_start> group;
  const int64_t at = join_step(st, mini);
  while (!st.queue.empty() && st.in_batch < static_cast<size_t>(st.cfg.max_batch)) {
    const uint64_t seq = st.queue.front();
    auto it = st.live.find(seq);
    if (it == st.live.end()) {
      st.queue.pop_front();
      continue;
    }
    Live& l = it->second;
    if (has_serving_shard(st) && !could_fit(st, l.tokens)) {
      st.queue.pop_front();
      fail(self, seq, "the sequence needs more KV-cache than any R-worker shard holds");
      continue;
    }
    if (st.cfg.scheduled &&
        st.planners[mini].quota(at, shape_of(l.req)) <= 0)
      break;
    l.mini = mini;  // placement spreads each mini-batch over the shards
    if (!place(st, l)) {
      say_waiting(st);
      break;  // later ones wait too
    }
    st.said_waiting = false;
    st.queue.pop_front();
    ++st.in_batch;
    if (st.cfg.scheduled) l.ticket = st.planners[mini].start(at, shape_of(l.req));
    group.push_back(seq_start{place_of(st, seq, l), l.req});
  }
  if (group.empty()) return;
  st.mini_seqs[mini] += group.size();
  std::vector<uint64_t> ids;
  for (auto& g : group) ids.push_back(g.place.seq);
  auto micro = spawn_micro_batch(self->system(), st.cfg.batch,
                                 caf::actor_cast<scheduler_actor>(self), std::move(group));
  for (uint64_t id : ids) {
    Live& l = st.live[id];
    l.micro = micro;
    l.mini = mini;
    l.req = gen_request{};  // the micro-batch has it now
  }
  self->send(st.minis[mini], add_atom::value, micro);
}

// Ends a live sequence on behalf of its client: queued ones at once, running ones at the next step.
void cancel(self_ptr self, uint64_t seq, const std::string& why) {
  auto& st = self->state;
  auto it = st.live.find(seq);
  if (it == st.live.end()) return;
  if (it->second.micro) {
    self->send(it->second.micro, cancel_atom::value, seq, why);
    return;
  }
  st.queue.erase(std::remove(st.queue.begin(), st.queue.end(), seq), st.queue.end());
  fail(self, seq, why);
}

// Answers the micro-batch's re-placement requests that can now be served.
void serve_replaces(self_ptr self) {
  auto& st = self->state;
  for (auto it = st.replaces.begin(); it != st.replaces.end();) {
    // Shards already chosen stay counted while the others wait: they will be used.
    bool ok = true;
    for (uint64_t seq : it->seqs) {
      auto l = st.live.find(seq);
      if (l != st.live.end()) ok &= place(st, l->second);
    }
    if (!ok) {
      say_waiting(st);  // sequences that lost their shard wait too
      ++it;
      continue;
    }
    st.said_waiting = false;
    std::vector<seq_place> out;
    for (uint64_t seq : it->seqs) {
      auto l = st.live.find(seq);
      if (l != st.live.end()) out.push_back(place_of(st, seq, l->second));
    }
    it->promise.deliver(std::move(out));
    it = st.replaces.erase(it);
  }
}

void finish_leaves(self_ptr self) {
  auto& st = self->state;
  for (auto it = st.leaves.begin(); it != st.leaves.end();) {
    const bool busy = std::any_of(st.live.begin(), st.live.end(), [&](const auto& kv) {
      return std::any_of(kv.second.shards.begin(), kv.second.shards.end(), [&](int32_t shard) {
        return std::find(it->shards.begin(), it->shards.end(), shard) != it->shards.end();
      });
    });
    if (busy) {
      ++it;
      continue;
    }
    // Those still live now run elsewhere; the others finished meanwhile.
    const auto moved = std::count_if(it->seqs.begin(), it->seqs.end(),
                                     [&](uint64_t seq) { return st.live.count(seq) > 0; });
    std::string names;
    for (int32_t id : it->shards) {
      auto e = st.shards.find(id);
      names += (names.empty() ? "" : ", ") +
               (e != st.shards.end() ? e->second.info.name : std::to_string(id));
      st.shards.erase(id);
    }
    log(st) << "scheduler: " << names << " left; " << moved << " of the " << it->seqs.size()
            << " sequence(s) there moved to other shards\n";
    it->promise.deliver(true);
    it = st.leaves.erase(it);
  }
}

void drop_shard(self_ptr self, int32_t id, const std::string& why) {
  auto& st = self->state;
  auto it = st.shards.find(id);
  if (it == st.shards.end()) return;
  log(st) << "scheduler: shard " << it->second.info.name << " " << why
            << "; its sequences move to other shards\n";
  self->demonitor(it->second.info.hdl.address());
  caf::anon_send_exit(it->second.info.hdl, caf::exit_reason::kill);
  st.shards.erase(it);
  note_shards(st);
  for (auto& m : st.minis) self->send(m, lost_atom::value, id);
}

trace_event counter(std::string track, const char* kind, std::string node, std::string detail,
                    std::vector<std::string> names, std::vector<double> values) {
  trace_event e;
  e.track = std::move(track);
  e.kind = kind;
  e.node = std::move(node);
  e.name = "state";
  e.ph = 'C';
  e.ts_us = trace_now_us();
  e.detail = std::move(detail);
  e.arg_names = std::move(names);
  e.arg_values = std::move(values);
  return e;
}

// Once a second while a console listens: the scheduler's and every shard's state as counters.
void snapshot(self_ptr self) {
  auto& st = self->state;
  size_t queued = st.queue.size(), running = st.live.size() - queued;
  trace_batch b;
  double w = 0, w_lim = 0;
  for (size_t m = 0; m < st.planners.size(); ++m) {
    w += double(st.planners[m].planned_load(st.mini_step[m]));
    w_lim += double(st.planners[m].load_limit());
  }
  b.events.push_back(counter("scheduler", "scheduler", kLocalNode,
                             st.cfg.scheduled ? schedule_name(st.cfg.schedule.kind) : "continuous",
                             {"queued", "running", "shards", "W", "W_lim"},
                             {double(queued), double(running), double(st.shards.size()), w, w_lim}));
  for (auto& sub : st.subscribers) self->send(sub, b);
  for (auto& [id, e] : st.shards) {
    const std::string track = shard_track(id), name = e.info.name;
    const std::string node = e.info.node.empty() ? kLocalNode : e.info.node;
    self->request(e.info.hdl, std::chrono::seconds(1), stats_atom::value)
        .then(
            [self, track, node, name](shard_stats& s) {
              trace_batch b;
              b.events.push_back(counter(
                  track, "shard", node, name,
                  {"sequences", "tokens", "used_pages", "free_pages", "page_bytes", "busy_ms",
                   "requests"},
                  {double(s.sequences), double(s.tokens), double(s.used_pages),
                   double(s.free_pages), double(s.page_bytes), s.busy_ms, double(s.requests)}));
              for (auto& sub : self->state.subscribers) self->send(sub, b);
            },
            [](caf::error&) {});
  }
}

shard_ids register_shards(self_ptr self, add_shards& req) {
  auto& st = self->state;
  shard_ids out;
  for (auto& info : req.shards) {
    if (!info.hdl || info.page_tokens <= 0 || info.group < 0 || info.group >= st.cfg.groups)
      continue;
    const int32_t id = st.next_shard++;
    self->monitor(info.hdl);
    log(st) << "scheduler: shard " << info.name << " joined (" << info.pages << " pages of "
              << info.page_tokens << " tokens)\n";
    st.shards.emplace(id, ShardEntry{std::move(info), 0, false, {}});
    out.ids.push_back(id);
  }
  note_shards(st);
  serve_replaces(self);
  admit_queued(self);
  return out;
}

scheduler_actor::behavior_type sched_behavior(self_ptr self, SchedulerConfig cfg,
                                              std::vector<stream_actor> streams) {
  auto& st = self->state;
  st.cfg = cfg;
  for (auto& stream : streams) {
    MiniBatchConfig mc = cfg.mini;
    mc.index = static_cast<int>(st.minis.size());
    st.minis.push_back(spawn_mini_batch(self->system(), mc, caf::actor_cast<scheduler_actor>(self),
                                        std::move(stream)));
    self->link_to(st.minis.back());
  }
  st.mini_seqs.assign(st.minis.size(), 0);
  st.mini_step.assign(st.minis.size(), 0);
  if (cfg.scheduled)
    st.planners.assign(st.minis.size(), LoadPlanner(resolve_schedule(cfg.schedule)));
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (auto& [id, e] : st.shards)
      if (e.info.hdl.address() == dm.source) return drop_shard(self, id, "went down");
    auto sub = std::find_if(st.subscribers.begin(), st.subscribers.end(),
                            [&](const trace_sink& t) { return t.address() == dm.source; });
    if (sub != st.subscribers.end()) {
      st.subscribers.erase(sub);
      if (st.subscribers.empty())
        for (auto& m : st.minis) self->send(m, subscribe_atom::value, false);
      return;
    }
    // A client went away: its sequences end and free their KV-cache; nobody else notices.
    std::vector<uint64_t> gone;
    for (auto& [seq, l] : st.live)
      if (l.client == dm.source) gone.push_back(seq);
    for (uint64_t seq : gone) cancel(self, seq, "cancelled: the client went away");
  });
  self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
  return {
      [self](gen_request& req) -> caf::result<gen_result> {
        auto& st = self->state;
        if (auto why = check_request(st.cfg.batch.model, req); !why.empty()) {
          gen_result r;
          r.n_prompt = static_cast<int32_t>(req.prompt.size());
          r.error = why;
          return r;
        }
        const uint64_t id = st.next_seq++;
        Live l;
        // Before the promise: making it moves the sender out of the current message.
        if (auto sender = self->current_sender()) {
          l.client = caf::actor_cast<caf::actor_addr>(sender);
          self->monitor(caf::actor_cast<caf::actor>(sender));
        }
        l.promise = self->make_response_promise<gen_result>();
        l.tokens = std::min<uint64_t>(req.prompt.size() + req.max_new, st.cfg.batch.model.ctx);
        l.tag = req.tag;
        l.req = std::move(req);
        l.since = clock::now();
        auto promise = l.promise;
        st.live.emplace(id, std::move(l));
        st.queue.push_back(id);
        if (!st.cfg.scheduled) {
          admit_queued(self);
        } else if (!st.admit_pending) {
          // Under a schedule, an idle mini-batch starts once the requests already in the mailbox
          // (a burst sent together) are queued too, so its first batch is not just the first one.
          st.admit_pending = true;
          self->send(self, step_atom::value, int32_t{-1});
        }
        return promise;
      },
      [self](seq_done& done) {
        auto& st = self->state;
        auto it = st.live.find(done.seq);
        if (it == st.live.end()) return;
        release(st, it->second);
        it->second.promise.deliver(std::move(done.result));
        if (it->second.micro) {
          const size_t m = it->second.mini;
          st.mini_seqs[m]--;
          if (st.cfg.scheduled) st.planners[m].finish(it->second.ticket, st.mini_step[m]);
        }
        st.live.erase(it);
        --st.in_batch;
        admit_queued(self);
        finish_leaves(self);
      },
      [self](add_shards& req) { return register_shards(self, req); },
      [self](lost_atom, int32_t id) {
        // A mini-batch that learnt of a leave avoids the shard as if it were gone; a leaving
        // shard still answers and is no longer watched, so there is nothing to drop.
        auto it = self->state.shards.find(id);
        if (it != self->state.shards.end() && !it->second.leaving)
          drop_shard(self, id, "stopped answering");
      },
      [self](subscribe_atom, trace_sink sink) {
        auto& st = self->state;
        if (!sink) return;
        self->monitor(sink);
        st.subscribers.push_back(std::move(sink));
        if (st.subscribers.size() == 1)
          for (auto& m : st.minis) self->send(m, subscribe_atom::value, true);
      },
      [self](step_atom, int32_t mini) {
        auto& st = self->state;
        if (mini == -1) {
          if (batch_filling(st)) {
            self->delayed_send(self, std::chrono::milliseconds(1), step_atom::value, int32_t{-1});
            return;
          }
          st.admit_pending = false;
          return admit_queued(self);
        }
        if (mini < 0 || static_cast<size_t>(mini) >= st.minis.size()) return;
        ++st.mini_step[mini];
        if (st.cfg.scheduled) admit_queued(self, mini);
        self->send(st.minis[mini], admitted_atom::value);  // after the admissions' add_atom
      },
      [self](trace_packed& p) {
        auto& st = self->state;
        if (st.subscribers.empty()) return;
        for (auto& [id, e] : st.shards) {
          p.shard_ids.push_back(id);
          p.shard_nodes.push_back(e.info.node.empty() ? kLocalNode : e.info.node);
        }
        for (size_t i = 0; i + 1 < st.subscribers.size(); ++i) self->send(st.subscribers[i], p);
        self->send(st.subscribers.back(), std::move(p));
      },
      [self](cancel_atom, uint64_t tag) {
        auto& st = self->state;
        const auto client = caf::actor_cast<caf::actor_addr>(self->current_sender());
        for (auto& [seq, l] : st.live)
          if (l.client == client && l.tag == tag) return cancel(self, seq, "cancelled");
      },
      [self](stats_atom) {
        const auto& st = self->state;
        sched_stats s;
        for (auto& [id, e] : st.shards) s.shards += e.leaving ? 0 : 1;
        s.queued = st.queue.size();
        s.live = st.live.size();
        return s;
      },
      [self](leave_request& req) -> caf::result<bool> {
        auto& st = self->state;
        Leave lv{self->make_response_promise<bool>(), {}, {}};
        for (auto& [id, e] : st.shards)
          if (std::find(req.shards.begin(), req.shards.end(), e.info.hdl) != req.shards.end()) {
            e.leaving = true;
            lv.shards.push_back(id);
            self->demonitor(e.info.hdl.address());
            size_t moving = 0;
            for (auto& [seq, l] : st.live)
              if (std::find(l.shards.begin(), l.shards.end(), id) != l.shards.end()) {
                ++moving;
                lv.seqs.push_back(seq);
              }
            log(st) << "scheduler: shard " << e.info.name << " is leaving; " << moving
                    << " sequence(s) move to other shards\n";
            for (auto& m : st.minis) self->send(m, lost_atom::value, id);
          }
        note_shards(st);
        auto promise = lv.promise;
        st.leaves.push_back(std::move(lv));
        finish_leaves(self);
        return promise;
      },
      [self](replace_request& req) -> caf::result<std::vector<seq_place>> {
        auto& st = self->state;
        Replace r{self->make_response_promise<std::vector<seq_place>>(), std::move(req.seqs),
                  clock::now()};
        auto promise = r.promise;
        st.replaces.push_back(std::move(r));
        serve_replaces(self);
        finish_leaves(self);
        return promise;
      },
      [self](tick_atom) {
        auto& st = self->state;
        const auto now = clock::now();
        const std::string why = "no R-worker shard could take the sequence within " +
                                std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                                   st.cfg.shard_wait).count()) + " s";
        for (auto it = st.queue.begin(); it != st.queue.end();) {
          auto l = st.live.find(*it);
          if (l != st.live.end() && waited_too_long(st, l->second, now)) {
            fail(self, *it, why);
            it = st.queue.erase(it);
          } else {
            ++it;
          }
        }
        for (auto it = st.replaces.begin(); it != st.replaces.end();) {
          if (now - it->since > st.cfg.shard_wait) {
            it->promise.deliver(caf::make_error(caf::sec::runtime_error, why));
            it = st.replaces.erase(it);
          } else {
            ++it;
          }
        }
        if (!st.subscribers.empty()) snapshot(self);
        self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
      },
  };
}

}  // namespace

std::string check_request(const ModelConfig& model, const gen_request& req) {
  if (req.prompt.empty()) return "the prompt is empty";
  if (req.prompt.size() >= static_cast<size_t>(model.ctx))
    return "the prompt has " + std::to_string(req.prompt.size()) +
           " tokens, but the model's context holds " + std::to_string(model.ctx) +
           " (prompt and generated tokens together)";
  for (int32_t t : req.prompt)
    if (t < 0 || t >= model.vocab)
      return "prompt token id " + std::to_string(t) + " is not in the vocabulary";
  if (req.max_new < 1) return "the number of tokens to generate must be at least 1";
  if (!(req.temperature >= 0)) return "temperature must be >= 0";
  if (!(req.top_p > 0 && req.top_p <= 1)) return "top-p must be in (0, 1]";
  return "";
}

scheduler_actor spawn_scheduler(caf::actor_system& sys, const SchedulerConfig& cfg,
                                std::vector<stream_actor> streams) {
  return sys.spawn(sched_behavior, cfg, std::move(streams));
}

}  // namespace fd
