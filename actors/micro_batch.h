// Micro-batch: sequences admitted together. It owns their token history, sampling and placement;
// its mini-batch steps it through the model together with the other micro-batches of that stage.
#pragma once
#include <vector>

#include "actors/type_ids.h"
#include "runtime/model.h"

namespace fd {

struct MicroBatchConfig {
  ModelConfig model;
  int32_t eos = 2;
};

micro_batch_actor spawn_micro_batch(caf::actor_system& sys, const MicroBatchConfig& cfg,
                                    scheduler_actor scheduler, std::vector<seq_start> seqs);

}  // namespace fd
