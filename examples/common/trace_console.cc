#include "examples/common/trace_console.h"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>

#include "actors/trace_packed.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "examples/common/client_connection.h"
#include "examples/common/stop_signals.h"
#include "examples/common/trace_record.h"
#include "examples/common/trace_view.h"

namespace fd {
namespace {

using clock = std::chrono::steady_clock;

constexpr auto kRequestTimeout = std::chrono::seconds(10);

}  // namespace

int run_trace(const TraceArgs& args) {
  StopSignals signals;  // before the actor system: SIGINT/SIGTERM reach only poll()
  std::unique_ptr<ChromeTraceWriter> rec;
  if (!args.record.empty()) rec = std::make_unique<ChromeTraceWriter>(args.record);
  caf::actor_system_config cfg;
  configure_client(cfg);
  caf::actor_system sys{cfg};
  const ClientConnection conn = connect_client(sys, args.connect, args.token, kRequestTimeout);
  caf::scoped_actor self{sys};
  self->monitor(conn.scheduler);
  self->monitor(conn.gate);
  self->send(conn.scheduler, subscribe_atom::value, caf::actor_cast<trace_sink>(self));

  const bool tty = isatty(STDOUT_FILENO);
  TraceView view;
  const auto t0 = clock::now();
  const auto refresh = std::chrono::duration<double>(args.refresh_s);
  auto window_start = t0;
  bool gone = false;
  int rc = 0;
  std::map<int32_t, std::string> shard_nodes;  // shard id -> node, as the node last said
  std::vector<trace_event> unpacked;           // reused
  auto take = [&](const std::vector<trace_event>& events) {
    for (auto& e : events) {
      view.add(e);
      if (rec) rec->add(e);
    }
  };
  const std::string title = "fastdecode-trace " + conn.where;
  while (true) {
    self->receive(
        [&](trace_batch& b) { take(b.events); },
        [&](trace_packed& p) {
          learn_shard_nodes(p, shard_nodes);
          view.add_spans(p, shard_nodes);
          if (!rec) return;
          unpacked.clear();
          unpack_spans(p, shard_nodes, unpacked);
          for (auto& e : unpacked) rec->add(e);
        },
        [&](caf::down_msg&) { gone = true; },
        caf::after(std::chrono::milliseconds(50)) >> [] {});
    const auto now = clock::now();
    if (!args.quiet && now - window_start >= refresh) {
      const double window_s = std::chrono::duration<double>(now - window_start).count();
      const std::string text = view.render(window_s, title);
      std::fputs(tty ? "\x1b[H\x1b[2J" : "\n", stdout);
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
      window_start = now;
    }
    if (gone) {
      std::fprintf(stderr, "fastdecode-trace: connection to %s lost\n", conn.where.c_str());
      rc = 1;
      break;
    }
    if (signals.poll(std::chrono::milliseconds(0)) != 0) break;
    if (args.duration_s > 0 && std::chrono::duration<double>(now - t0).count() >= args.duration_s)
      break;
  }
  if (rec) {
    rec->close();
    std::fprintf(stderr, "fastdecode-trace: %zu events written to %s\n", rec->events(),
                 args.record.c_str());
  }
  return rc;
}

}  // namespace fd
