// Micro-batch: the sequences that step through the model together. One step is the whole journey
// of one token per sequence (all prompt tokens on its first step): S-part on the GPU stream,
// R-part on each sequence's shard, layer by layer, then sampling.
#pragma once
#include "actors/type_ids.h"
#include "runtime/model.h"

namespace fd {

struct MicroBatchConfig {
  ModelConfig model;
  int32_t eos = 2;
  caf::timespan timeout = std::chrono::seconds(60);  // per S-part or R-part request
};

micro_batch_actor spawn_micro_batch(caf::actor_system& sys, const MicroBatchConfig& cfg,
                                    scheduler_actor scheduler, stream_actor stream);

}  // namespace fd
