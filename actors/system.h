// Actor-system settings every node needs, and the single-process deployment (`--role all`).
#pragma once
#include <memory>
#include <vector>

#include "actors/scheduler.h"
#include "actors/type_ids.h"
#include "caf/actor_system_config.hpp"
#include "runtime/spart.h"

namespace fd {

// Registers the message types and tunes CAF 0.17 for low per-hop latency. Never parses argv:
// Boost.Program_options owns the command line.
void configure_caf(caf::actor_system_config& cfg, int scheduler_threads);

struct LocalOptions {
  int shards = 2;
  size_t kv_memory = size_t(1) << 30;  // bytes per shard
  int block_tokens = 16;
  int max_batch = 256;
  caf::timespan timeout = std::chrono::seconds(60);
};

// Shards, one GPU stream and the scheduler, all in this process.
struct LocalNode {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const SPartBackend> backend;
  std::vector<shard_actor> shards;
  stream_actor stream;
  scheduler_actor scheduler;
};

LocalNode start_local_node(caf::actor_system& sys, std::shared_ptr<const Model> model,
                           const LocalOptions& opt);
void stop_local_node(LocalNode& node);

// Sends every request at once and waits for all answers; a failed or timed-out request gets its
// error in gen_result::error, the others are unaffected.
std::vector<gen_result> generate(caf::actor_system& sys, const scheduler_actor& scheduler,
                                 const std::vector<gen_request>& reqs, caf::timespan timeout);

}  // namespace fd
