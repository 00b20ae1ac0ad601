// The data lane: attention requests to a remote R-worker shard, and their answers, travel over a
// TCP connection of their own (runtime/lane_socket.h) instead of through CAF's BASP, which copies
// every tensor into and out of its buffers. Everything else (joining, drops, stats, links,
// heartbeats) stays with CAF, and so does fault detection: a lane shard is linked to the remote
// shard it stands for.
//
//   gpu node: LaneAcceptor ── one lane_actor per cpu node ── one lane shard per remote shard
//   cpu node: connect_lane() ── lane_server_actor ── the node's shards
//
// A request's journey: micro-batch → lane shard (no mailbox: handled in the sender's thread) →
// lane actor (writes the frame) → socket → the cpu node's reader thread → the shard's mailbox →
// the shard answers, and its answer is written to the socket in the shard's thread → the gpu
// node's reader thread → the micro-batch. Every other hop would wake one more thread.
//
// A cpu node joins (BASP), connects to the lane port from join_reply and says hello (secret,
// protocol version, run id and a random key); once welcomed it registers its shards naming that
// key, and the gatekeeper puts a lane shard in front of each.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "actors/type_ids.h"
#include "caf/actor_system.hpp"
#include "runtime/lane_socket.h"

namespace fd {

struct LaneWire;  // a lane's socket, requests in flight and writer (actors/data_lane.cc)

// A data lane to one cpu node (gpu side): its actor, and what its lane shards write through.
struct Lane {
  lane_actor actor;
  std::shared_ptr<LaneWire> wire;
  explicit operator bool() const { return static_cast<bool>(actor); }
};

// Lanes that passed the handshake, by key, until their node's add_shards claims them
// (shared by the acceptor's thread and the gatekeeper).
class LaneRegistry {
 public:
  void put(uint64_t key, Lane lane);
  // The lane of this key, once; an empty Lane when there is none.
  Lane take(uint64_t key);

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, Lane> lanes_;
};

struct LaneAcceptorConfig {
  std::string host;    // listen address
  uint16_t port = 0;   // 0: any free port
  std::string token;   // cluster secret
  uint64_t run_id = 0;
  caf::timespan timeout = std::chrono::seconds(60);  // per request, and per blocked write
  bool log = true;     // refusals on stderr
};

// Accepts the data lanes of cpu nodes on its own thread (gpu side).
class LaneAcceptor {
 public:
  // Listens now; throws fd::Error when it cannot.
  LaneAcceptor(caf::actor_system& sys, LaneAcceptorConfig cfg);
  ~LaneAcceptor();  // stops accepting and closes every lane it opened
  LaneAcceptor(const LaneAcceptor&) = delete;
  LaneAcceptor& operator=(const LaneAcceptor&) = delete;
  uint16_t port() const { return cfg_.port; }
  const std::shared_ptr<LaneRegistry>& registry() const { return registry_; }

 private:
  void run();
  void handshake(const std::shared_ptr<lane::Socket>& sock);
  // Joins the handshake threads that have ended (all of them with `all`, after shutting their sockets).
  void reap_handshakes(bool all);
  caf::actor_system& sys_;
  LaneAcceptorConfig cfg_;
  lane::Socket listener_;
  std::shared_ptr<LaneRegistry> registry_ = std::make_shared<LaneRegistry>();
  // One thread per peer saying hello, so a silent one delays nobody else.
  struct Handshake {
    std::shared_ptr<lane::Socket> sock;
    std::shared_ptr<std::atomic<bool>> done;
    std::thread thread;
  };
  std::vector<Handshake> handshakes_;  // the accept thread's
  std::mutex lanes_mu_;
  std::vector<std::pair<lane_actor, std::shared_ptr<lane::Socket>>> lanes_;  // guarded by lanes_mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The shard_actor that stands for remote shard `index` of a lane's cpu node: attention goes over
// the lane, drops and stats go to `remote` over CAF. Linked to `remote` (a kill of either ends
// both) and ends with the lane. It has no mailbox: messages are handled in the sender's thread.
shard_actor spawn_lane_shard(caf::actor_system& sys, shard_actor remote, const Lane& lane,
                             int32_t index);

// CPU side: connects to the gpu node's lane, says hello and waits for the answer; then serves
// requests for `shards` (by their index). `timeout` bounds each blocked write (the gpu node times
// its requests itself). Throws fd::Error naming the gpu node's refusal.
lane_server_actor connect_lane(caf::actor_system& sys, const std::string& host, uint16_t port,
                               const lane_hello& hello, std::vector<shard_actor> shards,
                               caf::timespan timeout);

}  // namespace fd
