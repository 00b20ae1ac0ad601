// Model parallelism of the S-part: a coordinator that looks like one GPU stream to its mini-batch
// and drives G S-workers — tensor-parallel ranks (a head and MLP slice each, partial sums
// all-reduced here) or pipeline stages (consecutive layers each, the residual stream handed on).
// Each S-worker's attention goes to its own R-group of shards (see r_group).
#pragma once
#include <memory>
#include <vector>

#include "actors/type_ids.h"
#include "runtime/model.h"

namespace fd {

class TpRankBackend;
class SPartBackend;

// The R-groups of G-way tensor or pipeline parallelism.
std::vector<r_group> tensor_parallel_groups(const ModelConfig& m, int g);
std::vector<r_group> pipeline_parallel_groups(const ModelConfig& m, int g);

// Tensor parallelism over the given ranks (shared between mini-batches; each coordinator spawns
// its own rank actors with their own activations).
stream_actor spawn_tensor_parallel(caf::actor_system& sys, const ModelConfig& m,
                                   std::vector<std::shared_ptr<const TpRankBackend>> ranks);

// Pipeline parallelism over stage backends of consecutive layers (groups from
// pipeline_parallel_groups give each stage's first layer).
stream_actor spawn_pipeline_parallel(caf::actor_system& sys, const ModelConfig& m,
                                     std::vector<std::shared_ptr<const SPartBackend>> stages,
                                     std::vector<r_group> groups);

}  // namespace fd
