#include "actors/gatekeeper.h"

#include <iostream>

#include "caf/all.hpp"

namespace fd {
namespace {

struct GateState {
  GatekeeperConfig cfg;
  scheduler_actor scheduler;
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
  return {
      [self](const join_request& req) -> caf::result<join_reply> {
        const auto& st = self->state;
        if (auto why = refusal(st, req.token, req.version); !why.empty())
          return refuse(self, "join of " + req.node, why);
        const ModelConfig& m = st.cfg.model;
        return join_reply{st.cfg.run_id, m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim,
                          st.cfg.block_tokens};
      },
      [self](add_shards& req) -> caf::result<shard_ids> {
        const auto& st = self->state;
        if (auto why = refusal(st, req.token, kProtocolVersion); !why.empty())
          return refuse(self, "shards", why);
        if (req.run_id != st.cfg.run_id)
          return refuse(self, "shards", "the shards joined an earlier run of this gpu node");
        for (const auto& s : req.shards)
          if (s.page_tokens != st.cfg.block_tokens)
            return refuse(self, "shards", "page size differs from the gpu node's");
        return self->delegate(st.scheduler, std::move(req));
      },
      [self](leave_request& req) -> caf::result<bool> {
        const auto& st = self->state;
        if (!same_secret(req.token, st.cfg.token))
          return refuse(self, "leave", "wrong cluster secret");
        return self->delegate(st.scheduler, std::move(req));
      },
      [self](const client_hello& req) -> caf::result<scheduler_actor> {
        const auto& st = self->state;
        if (auto why = refusal(st, req.token, req.version); !why.empty())
          return refuse(self, "client", why);
        return st.scheduler;
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

gatekeeper_actor spawn_gatekeeper(caf::actor_system& sys, const GatekeeperConfig& cfg,
                                  scheduler_actor scheduler) {
  return sys.spawn(gate_behavior, cfg, std::move(scheduler));
}

}  // namespace fd
