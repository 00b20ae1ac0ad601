// GPU stream: the S-part of one mini-batch in flight, on whatever backend the node runs
// (CPU, CUDA, or the simulated one). A pipeline-parallel stage is the same actor over the stage's
// layers, handing the residual stream to the next stage instead of producing logits.
#pragma once
#include <memory>

#include "actors/type_ids.h"
#include "runtime/spart.h"

namespace fd {

// Spawned detached: the S-part is long-running compute. The backend must outlive the actor.
stream_actor spawn_gpu_stream(caf::actor_system& sys, std::shared_ptr<const SPartBackend> backend);

// A pipeline stage; last: whether it ends with the logits (else with x for the next stage).
stage_actor spawn_stage(caf::actor_system& sys, std::shared_ptr<const SPartBackend> backend,
                        bool last);

}  // namespace fd
