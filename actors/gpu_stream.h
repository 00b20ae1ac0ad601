// GPU stream: the S-part of one mini-batch in flight, on whatever backend the node runs
// (CPU now, CUDA where a GPU is present).
#pragma once
#include <memory>

#include "actors/type_ids.h"
#include "runtime/spart.h"

namespace fd {

// Spawned detached: the S-part is long-running compute. The backend must outlive the actor.
stream_actor spawn_gpu_stream(caf::actor_system& sys, std::shared_ptr<const SPartBackend> backend);

}  // namespace fd
