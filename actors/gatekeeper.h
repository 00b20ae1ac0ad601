// Gatekeeper: the one actor a gpu node publishes on its port. A peer reaches the scheduler, or
// registers shards, only by presenting the cluster secret and the same protocol version.
#pragma once
#include <string>

#include <memory>

#include "actors/data_lane.h"
#include "actors/type_ids.h"
#include "runtime/model.h"

namespace fd {

struct GatekeeperConfig {
  std::string token;     // cluster secret; empty only on loopback
  uint64_t run_id = 0;   // random per gpu-node run
  ModelConfig model;
  std::vector<r_group> groups;  // what a shard of each R-group holds
  int block_tokens = 64;  // tokens per KV page, told to joining cpu nodes
  int max_seqs = 256;     // sequences holding KV at once (--max-batch), told to joining cpu nodes
  Vocab vocab{};         // sent to clients, which tokenize without the model file
  // The data lanes of cpu nodes (actors/data_lane.h); null: shards register without one.
  std::shared_ptr<LaneRegistry> lanes;
  int32_t lane_port = 0;
};

gatekeeper_actor spawn_gatekeeper(caf::actor_system& sys, const GatekeeperConfig& cfg,
                                  scheduler_actor scheduler);

// The vocabulary as a message, and back.
vocab_msg to_vocab_msg(const Vocab& v);
Vocab from_vocab_msg(const vocab_msg& m);

// Equal in time independent of where the strings differ.
bool same_secret(const std::string& a, const std::string& b);

}  // namespace fd
