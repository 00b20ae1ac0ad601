// R-worker shard: the R-part. Owns the KV-cache of its sequences and runs their attention.
#pragma once
#include <string>

#include "actors/type_ids.h"
#include "caf/actor.hpp"
#include "kernels/attention.h"
#include "runtime/kv_store.h"

namespace fd {

struct ShardConfig {
  std::string name;  // e.g. "cpu-1/shard-0"
  KvStoreConfig kv;
  kernels::AttnDims dims;
  int threads = 1;   // attention threads of this shard (a node's shards share its cores)
  caf::actor report_to;  // gets the shard's last shard_stats when an exit message stops it (may be unset)
  bool commit_kv = false;  // back the whole KV capacity with memory before the shard starts (KvStore::commit)
};

// Spawned detached: attention is long-running work that must not block CAF's scheduler threads.
// Throws fd::Error, and spawns nothing, when the KV store cannot be built (e.g. a capacity below
// one page) or its threads cannot start.
shard_actor spawn_shard(caf::actor_system& sys, const ShardConfig& cfg);

}  // namespace fd
