// R-worker shard: the R-part. Owns the KV-cache of its sequences and runs their attention.
#pragma once
#include <string>

#include "actors/type_ids.h"
#include "kernels/attention.h"
#include "runtime/kv_store.h"

namespace fd {

struct ShardConfig {
  std::string name;  // e.g. "shard-0@host"
  KvStoreConfig kv;
  kernels::AttnDims dims;
};

// Spawned detached: attention is long-running work that must not block CAF's scheduler threads.
shard_actor spawn_shard(caf::actor_system& sys, const ShardConfig& cfg);

}  // namespace fd
