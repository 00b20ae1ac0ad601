// Scheduler: admits generation requests, places each sequence on a shard that can hold it
// (better_place: fewest pages of its mini-batch, then least KV in use), feeds the micro-batch,
// and answers each request when its sequence leaves. Shards may join, leave or die at any time;
// their sequences are re-placed and re-prefilled.
#pragma once
#include <vector>

#include "actors/micro_batch.h"
#include "actors/mini_batch.h"
#include "actors/type_ids.h"
#include "runtime/load_control.h"

namespace fd {

struct SchedulerConfig {
  MicroBatchConfig batch;
  MiniBatchConfig mini;
  int max_batch = 256;                                   // sequences stepping together
  caf::timespan shard_wait = std::chrono::seconds(30);   // how long work waits for a shard
  // Schedules: how long an idle mini-batch waits after the first queued request for its batch
  // (B, or M) to fill before it starts with fewer. A burst of requests arrives one message at a
  // time; without a wait the first batch held only those already in the mailbox.
  caf::timespan admission_window = std::chrono::milliseconds(5);
  bool log = true;                                       // shard joins and losses on stderr
  int32_t groups = 1;                                    // R-groups (model parallelism)
  // Without a schedule, queued sequences start at once (continuous batching); with one, each
  // mini-batch's LoadPlanner decides how many start at each of its steps.
  bool scheduled = false;
  ScheduleConfig schedule;
};

// One mini-batch per stream: two streams give the two-stage pipeline.
scheduler_actor spawn_scheduler(caf::actor_system& sys, const SchedulerConfig& cfg,
                                std::vector<stream_actor> streams);

// What places a sequence of one mini-batch on a shard that can hold it.
struct ShardLoad {
  uint64_t mini_pages = 0;   // pages of that mini-batch on the shard
  uint64_t used_pages = 0;   // pages in use on the shard (both mini-batches)
  uint64_t free_tokens = 0;  // KV tokens it has free
};
// Whether a is a better place than b: fewer pages of the mini-batch (its R-part is as slow as its
// busiest shard), then fewer in use (the R-load of both mini-batches), then more free. By the
// most free alone, among shards of different capacities every mini-batch's first sequence went
// to the largest.
bool better_place(const ShardLoad& a, const ShardLoad& b);

// The reason a request cannot run on this model, or "" when it can.
std::string check_request(const ModelConfig& model, const gen_request& req);

}  // namespace fd
