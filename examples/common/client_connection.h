// How a client program (fastdecode-repl, fastdecode-trace) reaches a gpu node: the gatekeeper
// published on HOST:PORT, then the scheduler behind it.
#pragma once
#include <string>

#include "actors/type_ids.h"
#include "caf/actor_system.hpp"
#include "caf/actor_system_config.hpp"
#include "runtime/error.h"
#include "runtime/tokenizer.h"

namespace fd {

// The gpu node answered but refused this client (secret or protocol version).
class ClientRefused : public Error {
 public:
  using Error::Error;
};

struct ClientConnection {
  std::string where;  // HOST:PORT, for messages
  std::string token;  // cluster secret
  gatekeeper_actor gate;
  scheduler_actor scheduler;
};

// Actor-system settings of a client: the nodes' message types and network settings, but idle
// workers that sleep instead of polling (a console polling every few microseconds takes CPU
// from a node sharing its machine).
void configure_client(caf::actor_system_config& cfg);

// Throws ClientRefused when the node refuses the secret or version, fd::Error when it cannot be
// reached or does not answer within `timeout`.
ClientConnection connect_client(caf::actor_system& sys, const std::string& where,
                                const std::string& token, caf::timespan timeout);

// The tokenizer vocabulary of the node's model.
Vocab fetch_vocab(caf::actor_system& sys, const ClientConnection& conn, caf::timespan timeout);

}  // namespace fd
