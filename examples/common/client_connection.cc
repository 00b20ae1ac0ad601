#include "examples/common/client_connection.h"

#include "actors/gatekeeper.h"
#include "actors/system.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "examples/common/node_options.h"

namespace fd {
namespace {

// CAF's rendering of a refusal is "error(runtime_error, <why>)"-like; keep the reason only.
std::string reason(caf::actor_system& sys, const caf::error& e) {
  if (e.category() == caf::atom("system") &&
      e.code() == static_cast<uint8_t>(caf::sec::runtime_error) && !e.context().empty()) {
    std::string out;
    caf::message context = e.context();
    context.apply([&](const std::string& s) { out = s; });
    if (!out.empty()) return out;
  }
  return sys.render(e);
}

}  // namespace

void configure_client(caf::actor_system_config& cfg) {
  configure_caf(cfg, 2);
  // Idle workers go straight to sleeping on a condition variable, which a new job signals.
  cfg.set("work-stealing.aggressive-poll-attempts", 1);
  cfg.set("work-stealing.moderate-poll-attempts", 1);
  cfg.set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::milliseconds(10)});
  configure_network(cfg, std::chrono::seconds(3));  // a silent node is declared lost after 3 s
}

ClientConnection connect_client(caf::actor_system& sys, const std::string& where,
                                const std::string& token, caf::timespan timeout) {
  const HostPort hp = parse_host_port(where, "--connect");
  ClientConnection c;
  c.where = where;
  c.token = token;
  auto gate = sys.middleman().remote_actor<gatekeeper_actor>(hp.host, hp.port);
  if (!gate) {
    if (gate.error() == caf::sec::unexpected_actor_messaging_interface)
      throw ClientRefused("the node at " + where +
                          " speaks another protocol version (or is not a gpu node)");
    throw Error("cannot reach the gpu node at " + where + ": " + sys.render(gate.error()));
  }
  c.gate = *gate;
  caf::scoped_actor self{sys};
  bool refused = false;
  std::string why;
  self->request(c.gate, timeout, client_hello{token, kProtocolVersion})
      .receive([&](scheduler_actor& s) { c.scheduler = std::move(s); },
               [&](caf::error& e) {
                 refused = e != caf::sec::request_timeout;
                 why = reason(sys, e);
               });
  if (refused) throw ClientRefused("the gpu node at " + where + " refused this client: " + why);
  if (!c.scheduler) throw Error("the gpu node at " + where + " did not answer: " + why);
  return c;
}

Vocab fetch_vocab(caf::actor_system& sys, const ClientConnection& conn, caf::timespan timeout) {
  caf::scoped_actor self{sys};
  Vocab v;
  std::string why;
  self->request(conn.gate, timeout, vocab_atom::value, client_hello{conn.token, kProtocolVersion})
      .receive([&](vocab_msg& m) { v = from_vocab_msg(m); },
               [&](caf::error& e) { why = reason(sys, e); });
  if (!why.empty())
    throw Error("no vocabulary from the gpu node at " + conn.where + ": " + why);
  if (v.size() == 0) throw Error("the gpu node at " + conn.where + " sent an empty vocabulary");
  return v;
}

}  // namespace fd
