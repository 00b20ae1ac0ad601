// Actor-system settings every node needs, and the single-process deployment (`--role all`).
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "actors/rworker_shard.h"
#include "actors/scheduler.h"
#include "actors/type_ids.h"
#include "caf/actor_system_config.hpp"
#include "runtime/load_control.h"
#include "runtime/spart.h"

namespace fd {

// Registers the message types and picks CAF 0.17's scheduler (see system.cc for why). Never
// parses argv: Boost.Program_options owns the command line.
void configure_caf(caf::actor_system_config& cfg, int scheduler_threads);

// Loads the middleman (before the actor system is built) with heartbeats on, so a silent peer
// is declared dead after connection_timeout.
void configure_network(caf::actor_system_config& cfg, caf::timespan connection_timeout);

struct LocalOptions {
  int shards = 2;
  size_t kv_memory = size_t(1) << 30;  // bytes per shard
  int block_tokens = 64;  // tokens per KV page (runtime/kv_store.h)
  int max_batch = 256;
  caf::timespan timeout = std::chrono::seconds(60);     // per S-part or R-part request
  caf::timespan shard_wait = std::chrono::seconds(30);  // work waits this long for a shard
  caf::timespan admission_window = std::chrono::milliseconds(5);  // see SchedulerConfig
  bool log = true;                                      // scheduler lines on stderr
  int pipeline = 2;                                     // mini-batches in flight (1 to 4)
  std::vector<r_group> groups;  // set from the parallelism below; empty: one with everything
  int tensor_parallel = 1;      // S-workers, each with a head/MLP slice and its own R-group
  int pipeline_parallel = 1;    // S-workers, each with consecutive layers and its own R-group
  std::string backend = "cpu";  // cpu, cuda, auto (CUDA when usable) or sim
  std::string sim_profile;      // --backend sim: T(B) table, see runtime/sim_backend.h
  kernels::KvDtype kv_dtype = kernels::KvDtype::f16;  // f16, or quantized int8/int4
  bool kv_commit = false;       // back each shard's kv_memory with memory at start (--kv-commit)
  int attn_threads = 0;         // a node's attention threads, shared by its shards; 0: cores
  bool scheduled = false;       // false: continuous batching; true: `schedule` per mini-batch
  ScheduleConfig schedule;
};

// The R-group holding every layer and head of the model.
r_group whole_model_group(const ModelConfig& m);

// The nodes stop their actors when they end, by return or by an error: an actor left running
// would keep the actor system's destructor, and so the process, waiting. A node must therefore
// end before its actor system.

// The scheduler and its GPU stream, with no shard yet (`--role gpu`).
struct GpuNode {
  std::shared_ptr<const Model> model;
  std::vector<r_group> groups;
  std::string backend_note;                             // which S-part backend runs, and why
  std::vector<std::shared_ptr<const void>> keep_alive;  // stage models and rank backends
  std::vector<stream_actor> streams;  // one per mini-batch
  scheduler_actor scheduler;

  GpuNode() = default;
  GpuNode(GpuNode&&) = default;  // the moved-from node holds no actor
  GpuNode& operator=(GpuNode&& o) noexcept;  // stops this node's actors first
  ~GpuNode();
};
// Throws fd::Error for an impossible backend or parallelism.
GpuNode start_gpu_node(caf::actor_system& sys, std::shared_ptr<const Model> model,
                       const LocalOptions& opt);
// Stops the node's actors now; it then holds none.
void stop_gpu_node(GpuNode& node);

// Shards, one GPU stream and the scheduler, all in this process.
struct LocalNode {
  GpuNode gpu;
  std::vector<shard_actor> shards;
  scheduler_actor scheduler;

  LocalNode() = default;
  LocalNode(LocalNode&&) = default;
  LocalNode& operator=(LocalNode&& o) noexcept;
  ~LocalNode();
};

LocalNode start_local_node(caf::actor_system& sys, std::shared_ptr<const Model> model,
                           const LocalOptions& opt);
void stop_local_node(LocalNode& node);

// Attention threads per shard when a node's n shards share `node_threads` (0: all cores).
int threads_per_shard(int node_threads, int n);

// Spawns n shards for R-group `group` and describes them for registration. Each shard sends its
// last shard_stats to `report_to` (when set) as an exit message stops it. commit_kv: each shard's
// KV capacity is backed with memory before this returns (ShardConfig::commit_kv).
std::vector<shard_info> spawn_shards(caf::actor_system& sys, const std::string& prefix, int n,
                                     const KvStoreConfig& kv, const kernels::AttnDims& dims,
                                     int32_t group = 0, int threads_per_shard = 1,
                                     caf::actor report_to = {}, bool commit_kv = false);

// Sends every request at once and waits for all answers; a failed or timed-out request gets its
// error in gen_result::error, the others are unaffected.
std::vector<gen_result> generate(caf::actor_system& sys, const scheduler_actor& scheduler,
                                 const std::vector<gen_request>& reqs, caf::timespan timeout);

}  // namespace fd
