// Scheduler: admits generation requests, places each sequence on the shard with the least load,
// and feeds the micro-batch; answers each request when its sequence leaves the batch.
#pragma once
#include <vector>

#include "actors/micro_batch.h"
#include "actors/type_ids.h"

namespace fd {

struct SchedulerConfig {
  MicroBatchConfig batch;
  int max_batch = 256;  // sequences stepping together; more wait in the queue
};

scheduler_actor spawn_scheduler(caf::actor_system& sys, const SchedulerConfig& cfg,
                                stream_actor stream, std::vector<shard_actor> shards);

// The reason a request cannot run on this model, or "" when it can.
std::string check_request(const ModelConfig& model, const gen_request& req);

}  // namespace fd
