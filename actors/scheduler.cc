#include "actors/scheduler.h"

#include <algorithm>
#include <deque>
#include <unordered_map>

#include "caf/all.hpp"

namespace fd {
namespace {

struct Live {
  caf::typed_response_promise<gen_result> promise;
  int32_t shard = 0;
  uint64_t load = 0;  // tokens the sequence may occupy on its shard
};

struct SchedState {
  SchedulerConfig cfg;
  std::vector<shard_actor> shards;
  std::vector<uint64_t> shard_load;  // [shards] tokens placed
  micro_batch_actor batch;
  uint64_t next_seq = 1;
  std::unordered_map<uint64_t, Live> live;
  std::deque<seq_start> queue;  // admitted, waiting for room in the batch
  size_t in_batch = 0;
  static inline const char* name = "scheduler";
};

using self_ptr = scheduler_actor::stateful_pointer<SchedState>;

void admit_queued(self_ptr self) {
  auto& st = self->state;
  while (!st.queue.empty() && st.in_batch < static_cast<size_t>(st.cfg.max_batch)) {
    self->send(st.batch, std::move(st.queue.front()));
    st.queue.pop_front();
    ++st.in_batch;
  }
}

int32_t place(const SchedState& st) {
  auto it = std::min_element(st.shard_load.begin(), st.shard_load.end());
  return static_cast<int32_t>(it - st.shard_load.begin());
}

scheduler_actor::behavior_type sched_behavior(self_ptr self, SchedulerConfig cfg,
                                              stream_actor stream, std::vector<shard_actor> shards) {
  auto& st = self->state;
  st.cfg = cfg;
  st.shards = shards;
  st.shard_load.assign(shards.size(), 0);
  st.batch = spawn_micro_batch(self->system(), cfg.batch, caf::actor_cast<scheduler_actor>(self),
                               std::move(stream), std::move(shards));
  self->link_to(st.batch);
  return {
      [self](gen_request& req) -> caf::result<gen_result> {
        auto& st = self->state;
        std::string why = check_request(st.cfg.batch.model, req);
        if (why.empty() && st.shards.empty()) why = "no R-worker shard is available";
        if (!why.empty()) {
          gen_result r;
          r.n_prompt = static_cast<int32_t>(req.prompt.size());
          r.error = why;
          return r;
        }
        const uint64_t id = st.next_seq++;
        Live live;
        live.promise = self->make_response_promise<gen_result>();
        live.shard = place(st);
        live.load = std::min<uint64_t>(req.prompt.size() + req.max_new, st.cfg.batch.model.ctx);
        st.shard_load[live.shard] += live.load;
        auto promise = live.promise;
        st.queue.push_back(seq_start{id, live.shard, std::move(req)});
        st.live.emplace(id, std::move(live));
        admit_queued(self);
        return promise;
      },
      [self](seq_done& done) {
        auto& st = self->state;
        auto it = st.live.find(done.seq);
        if (it == st.live.end()) return;
        st.shard_load[it->second.shard] -= it->second.load;
        it->second.promise.deliver(std::move(done.result));
        st.live.erase(it);
        --st.in_batch;
        admit_queued(self);
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
    if (t < 0 || t >= model.vocab) return "prompt token id " + std::to_string(t) + " is not in the vocabulary";
  if (req.max_new < 1) return "the number of tokens to generate must be at least 1";
  if (!(req.temperature >= 0)) return "temperature must be >= 0";
  if (!(req.top_p > 0 && req.top_p <= 1)) return "top-p must be in (0, 1]";
  return "";
}

scheduler_actor spawn_scheduler(caf::actor_system& sys, const SchedulerConfig& cfg,
                                stream_actor stream, std::vector<shard_actor> shards) {
  return sys.spawn(sched_behavior, cfg, std::move(stream), std::move(shards));
}

}  // namespace fd
