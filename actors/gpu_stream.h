// GPU stream: the S-part of one mini-batch in flight, on whatever backend the node runs
// (CPU, CUDA, or the simulated one). A pipeline-parallel stage is the same actor over the stage's
// layers, handing the residual stream to the next stage instead of producing logits.
#pragma once
#include <memory>
#include <vector>

#include "actors/type_ids.h"
#include "runtime/spart.h"

namespace fd {

// Spawned detached: the S-part is long-running compute. The backend must outlive the actor.
stream_actor spawn_gpu_stream(caf::actor_system& sys, std::shared_ptr<const SPartBackend> backend);

// A pipeline stage; last: whether it ends with the logits (else with x for the next stage).
stage_actor spawn_stage(caf::actor_system& sys, std::shared_ptr<const SPartBackend> backend,
                        bool last);

// What a stream (or a tensor-parallel rank) answers once layer next_layer - 1 is done: the next
// layer's Q/K/V (computed into qkv, whose bytes move into out), past the last layer the logits
// when `logits` says it produces them, else nothing (returns false).
template <class Backend, class State>
bool fill_output(const Backend& b, State& act, int next_layer, bool logits, AttnIn& qkv,
                 s_output& out) {
  out.next_layer = next_layer;
  if (next_layer < b.config().n_layers) {
    b.attn_in(act, next_layer, qkv);
    out.q = qkv.q.release();
    out.k = qkv.k.release();
    out.v = qkv.v.release();
    return true;
  }
  if (!logits) return false;
  std::vector<float> l;
  b.logits(act, l);
  out.logits = to_bytes(l.data(), l.size());
  return true;
}

}  // namespace fd
