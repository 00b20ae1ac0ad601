// Mini-batch: one stage of the two-stage token pipeline. It steps all its micro-batches together —
// one S-part batch on its own GPU stream, then per layer one attention message per shard — so that
// while the shards work on this mini-batch, the GPU runs the other one.
#pragma once
#include "actors/type_ids.h"
#include "runtime/model.h"

namespace fd {

struct MiniBatchConfig {
  ModelConfig model;
  int index = 0;  // names its trace tracks: mini_batch-<index>, gpu_stream-<index>
  std::vector<r_group> groups;  // R-groups; seq_place::shards[g] is the sequence's shard in group g
  caf::timespan timeout = std::chrono::seconds(60);  // per S-part or R-part request
};

mini_batch_actor spawn_mini_batch(caf::actor_system& sys, const MiniBatchConfig& cfg,
                                  scheduler_actor scheduler, stream_actor stream);

}  // namespace fd
