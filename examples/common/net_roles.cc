#include "examples/common/net_roles.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <set>
#include <thread>

#include <unistd.h>

#include "actors/data_lane.h"
#include "actors/gatekeeper.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "examples/common/run_prompts.h"
#include "examples/common/stop_signals.h"
#include "kernels/ops.h"
#include "runtime/host_memory.h"
#include "runtime/kv_store.h"

namespace fd {
namespace {

constexpr auto kConnectionTimeout = std::chrono::seconds(3);

uint64_t random_run_id() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
}

void wait_for_shards(caf::actor_system& sys, const scheduler_actor& scheduler, int want,
                     double wait_s) {
  caf::scoped_actor self{sys};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  int have = 0;
  bool said = false;
  while (true) {
    self->request(scheduler, std::chrono::seconds(10), stats_atom::value)
        .receive([&](sched_stats& s) { have = s.shards; }, [&](caf::error&) {});
    if (have >= want) return;
    if (!said) {
      std::cerr << "gpu node: waiting for " << want << " R-worker shard(s), " << have
                << " joined\n";
      said = true;
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw Error("only " + std::to_string(have) + " of " + std::to_string(want) +
                  " R-worker shards joined within " + std::to_string(int(wait_s)) +
                  " s (--min-shards, --min-shards-wait)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Stops the gatekeeper when run_gpu_role ends, by return or by an error (a taken port, too few
// shards): an actor left running would keep the actor system's destructor, and so the process,
// waiting. The node stops its own actors.
struct StopGatekeeper {
  gatekeeper_actor& gate;
  ~StopGatekeeper() {
    if (gate) caf::anon_send_exit(gate, caf::exit_reason::user_shutdown);
  }
};

}  // namespace

int run_gpu_role(const NodeArgs& args) {
  const HostPort hp = parse_host_port(args.listen, "--listen");
  if (!is_loopback(hp.host) && args.token.empty())
    throw Error("refusing to listen on " + args.listen +
                " without a cluster secret: set --token or FASTDECODE_TOKEN");
  auto model = load_or_synthesize(args.model_path);
  StopSignals signals;
  kernels::set_gemm_threads(args.gemm_threads);
  caf::actor_system_config cfg;
  configure_caf(cfg, args.threads);
  configure_network(cfg, kConnectionTimeout);
  caf::actor_system sys{cfg};
  GpuNode node = start_gpu_node(sys, model, args.local);
  gatekeeper_actor gate;
  StopGatekeeper stop{gate};
  if (!node.backend_note.empty()) std::cerr << "gpu node: " << node.backend_note << "\n";
  GatekeeperConfig gc;
  gc.token = args.token;
  gc.run_id = random_run_id();
  gc.model = model->cfg;
  gc.groups = node.groups;
  gc.block_tokens = args.local.block_tokens;
  gc.max_seqs = args.local.max_batch;
  gc.vocab = model->vocab;
  LaneAcceptor lanes(sys, LaneAcceptorConfig{hp.host, static_cast<uint16_t>(args.lane_port), args.token,
                                             gc.run_id, args.local.timeout, true});
  gc.lanes = lanes.registry();
  gc.lane_port = lanes.port();
  gate = spawn_gatekeeper(sys, gc, node.scheduler);
  auto port = sys.middleman().publish(gate, hp.port, hp.host.c_str(), true);
  if (!port)
    throw Error("cannot listen on " + args.listen + " (is another node using the port?): " +
                sys.render(port.error()));
  std::cerr << "gpu node: serving " << model->name << " on " << hp.host << ":" << *port
            << " (data lane on port " << lanes.port() << ")\n";
  int rc = 0;
  if (args.prompts.empty()) {
    while (signals.poll(std::chrono::milliseconds(500)) == 0) {
    }
    std::cerr << "gpu node: stopping\n";
  } else {
    wait_for_shards(sys, node.scheduler, args.min_shards, args.min_shards_wait_s);
    std::cerr << "gpu node: generating\n";
    rc = generate_and_print(sys, node.scheduler, *model, args);
  }
  // Before the data lanes close, so that the scheduler does not see its shards go.
  caf::anon_send_exit(gate, caf::exit_reason::user_shutdown);
  stop_gpu_node(node);
  return rc;
}

namespace {

gatekeeper_actor connect(caf::actor_system& sys, const HostPort& hp, const std::string& where) {
  // The gpu node may still be starting: retry for a while.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (true) {
    auto gate = sys.middleman().remote_actor<gatekeeper_actor>(hp.host, hp.port);
    if (gate) return *gate;
    if (std::chrono::steady_clock::now() > deadline)
      throw Error("cannot reach the gpu node at " + where + ": " + sys.render(gate.error()));
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

// CAF 0.17 sometimes waits for ever in the actor system's destructor (await_detached_threads)
// for a stopped shard whose last reference the middleman still holds once the gpu node is gone:
// the process ends with `rc` at the latest `after` from now.
void exit_within(std::chrono::seconds after, int rc) {
  std::thread([after, rc] {
    std::this_thread::sleep_for(after);
    std::fflush(nullptr);
    std::_Exit(rc);
  }).detach();
}

// A node's shards as they stop: each one sends its last figures (report_to), then goes down.
struct StoppingShards {
  const std::vector<shard_actor>& hdls;
  std::vector<shard_stats> last;     // from the shards that stopped so far
  std::set<caf::actor_addr> down;

  // Whether `dm` is about one of the shards (it is then counted).
  bool note_down(const caf::down_msg& dm) {
    for (auto& s : hdls)
      if (dm.source == s.address()) {
        down.insert(dm.source);
        return true;
      }
    return false;
  }
};

// Stops the shards, waits until they are gone (a shard still running when the actor system shuts
// down can keep the process from exiting) and prints what they served.
void report_and_stop(caf::scoped_actor& self, const std::string& name, StoppingShards& sh) {
  for (auto& s : sh.hdls) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  bool waiting = true;
  while (waiting && sh.down.size() < sh.hdls.size())
    self->receive([&](shard_stats& st) { sh.last.push_back(std::move(st)); },
                  [&](caf::down_msg& dm) { sh.note_down(dm); },
                  caf::after(std::chrono::seconds(5)) >> [&] { waiting = false; });
  uint64_t requests = 0, sequences = 0;
  double busy_ms = 0;
  for (auto& st : sh.last) {
    requests += st.requests;
    sequences += st.served;
    busy_ms += st.busy_ms;
  }
  if (sh.last.size() < sh.hdls.size())
    std::cerr << "cpu node " << name << ": " << sh.hdls.size() - sh.last.size() << " of " << sh.hdls.size()
              << " shard(s) stopped without their figures; they are missing below\n";
  std::cerr << "cpu node " << name << ": served " << requests << " attention requests for " << sequences
            << " sequences (" << static_cast<int64_t>(busy_ms) << " ms busy)\n";
}

}  // namespace

int run_cpu_role(const NodeArgs& args) {
  const HostPort hp = parse_host_port(args.join, "--join");
  if (args.kv_memory_given) check_kv_memory(args.local.kv_memory, args.local.shards);
  StopSignals signals;
  caf::actor_system_config cfg;
  configure_caf(cfg, args.threads);
  configure_network(cfg, kConnectionTimeout);
  caf::actor_system sys{cfg};
  std::string name = args.node_name;
  if (name.empty()) {  // host:pid names the node in the gpu node's logs and traces
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    name = std::string(host) + ":" + std::to_string(::getpid());
  }
  auto gate = connect(sys, hp, args.join);
  caf::scoped_actor self{sys};

  join_reply shape;
  self->request(gate, std::chrono::seconds(30),
                join_request{args.token, kProtocolVersion, name, args.group})
      .receive([&](join_reply& r) { shape = r; },
               [&](caf::error& e) {
                 throw Error("the gpu node at " + args.join + " refused this node: " +
                             sys.render(e));
               });
  KvStoreConfig store{shape.n_layers, shape.n_kv_heads, shape.head_dim, shape.block_tokens,
                      args.local.kv_memory, args.local.kv_dtype};
  if (!args.kv_memory_given) {
    // Each shard holds what the gpu node's run can place on it, up to the default: a small model
    // does not take the default's memory.
    store.capacity_bytes = kv_memory_for(store, shape.max_seqs, shape.seq_tokens, args.local.kv_memory);
    std::cerr << "cpu node " << name << ": KV-cache of " << format_bytes(store.capacity_bytes)
              << " per shard, for " << shape.max_seqs << " sequences of up to " << shape.seq_tokens
              << " tokens (at most " << format_bytes(args.local.kv_memory) << "; --kv-memory sets it)\n";
    check_kv_memory(store.capacity_bytes, args.local.shards);
  }
  add_shards reg;
  reg.token = args.token;
  reg.run_id = shape.run_id;
  const auto spawned = std::chrono::steady_clock::now();
  reg.shards = spawn_shards(
      sys, name + "/shard-", args.local.shards, store,
      kernels::AttnDims{shape.n_heads, shape.n_kv_heads, shape.head_dim}, shape.group,
      threads_per_shard(args.local.attn_threads, args.local.shards), caf::actor_cast<caf::actor>(self),
      args.local.kv_commit);
  if (args.local.kv_commit)
    std::cerr << "cpu node " << name << ": KV-cache of " << args.local.shards << " x "
              << format_bytes(store.capacity_bytes) << " in memory after "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - spawned).count()
              << " s\n";
  std::vector<shard_actor> shards;
  for (auto& s : reg.shards) {
    s.node = name;
    shards.push_back(s.hdl);
  }
  // Attention tensors travel over the data lane; the shards register once it is open.
  lane_server_actor lane;
  try {
    if (shape.lane_port > 0) {
      reg.lane_key = random_run_id() | 1;
      lane = connect_lane(sys, hp.host, static_cast<uint16_t>(shape.lane_port),
                          lane_hello{args.token, kProtocolVersion, shape.run_id, reg.lane_key, name},
                          shards, args.local.timeout);
    }
    self->request(gate, std::chrono::seconds(30), std::move(reg))
        .receive([](shard_ids&) {},
                 [&](caf::error& e) {
                   throw Error("the gpu node at " + args.join + " refused the shards: " +
                               sys.render(e));
                 });
  } catch (const std::exception& e) {
    // Shards left running would keep the actor system, and the process, from ending; stopped,
    // they may still meet the wait described at the end of this function, so the error is said
    // here rather than after the actor system has gone.
    if (lane) caf::anon_send_exit(lane, caf::exit_reason::user_shutdown);
    for (auto& s : shards) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    const int rc = report_node_error(e);
    exit_within(std::chrono::seconds(3), rc);
    return rc;
  }
  std::cerr << "cpu node " << name << ": " << shards.size() << " shard(s) joined " << args.join
            << "\n";
  self->monitor(gate);
  StoppingShards stopping{shards, {}, {}};
  for (auto& s : shards) self->monitor(s);

  int rc = -1;
  while (rc < 0) {
    if (signals.poll(std::chrono::milliseconds(0)) != 0) {
      std::cerr << "cpu node " << name << ": leaving; moving its sequences first\n";
      self->request(gate, std::chrono::seconds(120), leave_request{args.token, shards})
          .receive([&](bool) { std::cerr << "cpu node " << name << ": left cleanly\n"; },
                   [&](caf::error& e) {
                     std::cerr << "cpu node " << name << ": leave failed: " << sys.render(e)
                               << "\n";
                   });
      rc = 0;
      break;
    }
    self->receive(
        [&](caf::down_msg& dm) {
          if (stopping.note_down(dm))
            std::cerr << "cpu node " << name
                      << ": the gpu node dropped a shard of this node (unresponsive?); exiting\n";
          else
            std::cerr << "cpu node " << name << ": lost the gpu node at " << args.join
                      << "; exiting\n";
          rc = 1;
        },
        [&](shard_stats& st) { stopping.last.push_back(std::move(st)); },
        caf::after(std::chrono::milliseconds(200)) >> [] {});
  }
  report_and_stop(self, name, stopping);
  if (lane) caf::anon_send_exit(lane, caf::exit_reason::user_shutdown);
  // Everything is reported by now.
  exit_within(std::chrono::seconds(3), rc);
  return rc;
}

}  // namespace fd
