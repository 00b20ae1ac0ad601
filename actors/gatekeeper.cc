#include "actors/gatekeeper.h"

#include <iostream>
#include <map>

#include "caf/all.hpp"
#include "runtime/error.h"

namespace fd {
namespace {

struct GateState {
  GatekeeperConfig cfg;
  scheduler_actor scheduler;
  std::map<caf::actor_addr, shard_actor> lane_shards;  // remote shard -> the lane shard for it
  static inline const char* name = "gatekeeper";
};

using self_ptr = gatekeeper_actor::stateful_pointer<GateState>;

// Why a peer is refused, or "" when it may pass.
std::string refusal(const GateState& st, const std::string& token, int32_t version) {
  if (version != kProtocolVersion)
    return "protocol version mismatch: this gpu node speaks version " +
           std::to_string(kProtocolVersion) + ", the peer " + std::to_string(version);
  if (!same_secret(token, st.cfg.token)) return "wrong cluster secret (--token / FASTDECODE_TOKEN)";
  return "";
}

caf::error refuse(self_ptr self, const std::string& what, const std::string& why) {
  std::cerr << "gatekeeper: refused " << what << ": " << why << "\n";
  (void)self;
  return caf::make_error(caf::sec::runtime_error, why);
}

gatekeeper_actor::behavior_type gate_behavior(self_ptr self, GatekeeperConfig cfg,
                                              scheduler_actor scheduler) {
  self->state.cfg = std::move(cfg);
  self->state.scheduler = std::move(scheduler);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& m = self->state.lane_shards;
    for (auto it = m.begin(); it != m.end(); ++it)
      if (it->second.address() == dm.source) {
        m.erase(it);
        return;
      }
  });
  return {
      [self](const join_request& req) -> caf::result<join_reply> {
        const auto& st = self->state;
        if (auto why = refusal(st, req.token, req.version); !why.empty())
          return refuse(self, "join of " + req.node, why);
        if (req.group < 0 || static_cast<size_t>(req.group) >= st.cfg.groups.size())
          return refuse(self, "join of " + req.node,
                        "no R-group " + std::to_string(req.group) + " (the gpu node has " +
                            std::to_string(st.cfg.groups.size()) + ")");
        const r_group& g = st.cfg.groups[req.group];
        return join_reply{st.cfg.run_id, g.layers, g.heads, g.kv_heads, st.cfg.model.head_dim,
                          st.cfg.block_tokens, req.group, st.cfg.lane_port, st.cfg.max_seqs,
                          st.cfg.model.ctx};
      },
      [self](add_shards& req) -> caf::result<shard_ids> {
        const auto& st = self->state;
        if (auto why = refusal(st, req.token, kProtocolVersion); !why.empty())
          return refuse(self, "shards", why);
        if (req.run_id != st.cfg.run_id)
          return refuse(self, "shards", "the shards joined an earlier run of this gpu node");
        for (const auto& s : req.shards) {
          if (s.page_tokens != st.cfg.block_tokens)
            return refuse(self, "shards", "page size differs from the gpu node's");
          if (s.group < 0 || static_cast<size_t>(s.group) >= st.cfg.groups.size())
            return refuse(self, "shards", "unknown R-group");
        }
        if (st.cfg.lanes) {
          // Attention goes over the node's data lane: each shard gets a lane shard in front.
          Lane lane = req.lane_key != 0 ? st.cfg.lanes->take(req.lane_key) : Lane{};
          if (!lane) return refuse(self, "shards", "their node has no data lane open");
          std::vector<shard_actor> fronts;
          for (size_t i = 0; i < req.shards.size(); ++i) {
            auto& s = req.shards[i];
            auto front = spawn_lane_shard(self->system(), s.hdl, lane, static_cast<int32_t>(i));
            self->state.lane_shards[s.hdl.address()] = front;
            self->monitor(front);
            s.hdl = front;
            fronts.push_back(front);
          }
          self->send(lane.actor, watch_atom::value, std::move(fronts));
        }
        return self->delegate(st.scheduler, std::move(req));
      },
      [self](leave_request& req) -> caf::result<bool> {
        const auto& st = self->state;
        if (!same_secret(req.token, st.cfg.token))
          return refuse(self, "leave", "wrong cluster secret");
        for (auto& s : req.shards)  // the scheduler knows them by their lane shards
          if (auto it = st.lane_shards.find(s.address()); it != st.lane_shards.end()) s = it->second;
        return self->delegate(st.scheduler, std::move(req));
      },
      [self](const client_hello& req) -> caf::result<scheduler_actor> {
        const auto& st = self->state;
        if (auto why = refusal(st, req.token, req.version); !why.empty())
          return refuse(self, "client", why);
        return st.scheduler;
      },
      [self](vocab_atom, const client_hello& req) -> caf::result<vocab_msg> {
        const auto& st = self->state;
        if (auto why = refusal(st, req.token, req.version); !why.empty())
          return refuse(self, "client", why);
        return to_vocab_msg(st.cfg.vocab);
      },
  };
}

}  // namespace

bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    diff |= static_cast<unsigned char>(i < a.size() ? a[i] : 0) ^
            static_cast<unsigned char>(i < b.size() ? b[i] : 0);
  return diff == 0;
}

vocab_msg to_vocab_msg(const Vocab& v) {
  vocab_msg m;
  m.pieces = v.pieces;
  m.scores = v.scores;
  m.types.reserve(v.types.size());
  for (TokenType t : v.types) m.types.push_back(static_cast<int32_t>(t));
  m.bos = v.bos;
  m.eos = v.eos;
  m.unk = v.unk;
  m.add_bos = v.add_bos;
  m.add_space_prefix = v.add_space_prefix;
  return m;
}

Vocab from_vocab_msg(const vocab_msg& m) {
  if (m.scores.size() != m.pieces.size() || m.types.size() != m.pieces.size())
    throw Error("the gpu node sent a malformed vocabulary (" + std::to_string(m.pieces.size()) +
                " pieces, " + std::to_string(m.scores.size()) + " scores, " +
                std::to_string(m.types.size()) + " types)");
  Vocab v;
  v.pieces = m.pieces;
  v.scores = m.scores;
  v.types.reserve(m.types.size());
  for (int32_t t : m.types) v.types.push_back(static_cast<TokenType>(t));
  v.bos = m.bos;
  v.eos = m.eos;
  v.unk = m.unk;
  v.add_bos = m.add_bos;
  v.add_space_prefix = m.add_space_prefix;
  return v;
}

gatekeeper_actor spawn_gatekeeper(caf::actor_system& sys, const GatekeeperConfig& cfg,
                                  scheduler_actor scheduler) {
  return sys.spawn(gate_behavior, cfg, std::move(scheduler));
}

}  // namespace fd
