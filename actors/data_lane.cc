#include "actors/data_lane.h"

#include <iostream>

#include "actors/gatekeeper.h"
#include <unordered_set>

#include "caf/actor_companion.hpp"
#include "caf/all.hpp"
#include "caf/scoped_execution_unit.hpp"
#include "runtime/error.h"

namespace fd {
namespace {

using namespace std::chrono_literals;
using lane::Buffer;
using lane::FrameKind;

constexpr auto kHandshakeTimeout = 5s;  // for a connecting peer to say hello
constexpr auto kClaimTimeout = 60s;     // for a welcomed node to register its shards
constexpr size_t kMaxHello = 64 << 10;  // bytes of a hello's metadata

std::chrono::milliseconds ms(caf::timespan t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t);
}

// The small fields of a frame, in CAF's binary format.
template <class... Ts>
Buffer encode(caf::actor_system& sys, Ts&... xs) {
  Buffer b;
  caf::binary_serializer sink{sys, b};
  if (auto err = sink(xs...)) throw Error("data lane: cannot encode a frame: " + sys.render(err));
  return b;
}

template <class... Ts>
bool decode(caf::actor_system& sys, const Buffer& b, Ts&... xs) {
  caf::binary_deserializer source{sys, b};
  return !source(xs...) && source.remaining() == 0;
}

void write_small(const lane::Socket& s, FrameKind kind, uint64_t ticket, const Buffer& meta) {
  lane::write_frame(s, kind, ticket, 0, meta, nullptr);
}

// A lane's socket and the thread that reads it: shutting the socket down ends the thread.
struct LaneEnd {
  std::shared_ptr<lane::Socket> sock;
  std::thread reader;
  ~LaneEnd() {
    if (sock) sock->shutdown();
    if (reader.joinable()) reader.join();
  }
};

// Reads frames until the connection ends, handing each to `take` (which throws fd::Error for a
// frame it cannot take); returns why the lane ended.
template <class Take>
std::string read_frames(const lane::Socket& sock, const char* closed, Take take) {
  try {
    lane::Frame f;
    while (lane::read_frame(sock, f)) take(f);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {  // e.g. no memory for a frame: the lane closes, nothing else
    return std::string("data lane: cannot take a frame: ") + e.what();
  }
  return closed;
}

// A request the lane has sent, waiting for its answer.
struct Waiter {
  caf::strong_actor_ptr source;
  caf::mailbox_element::forwarding_stack stages;
  caf::message_id id;
  std::chrono::steady_clock::time_point deadline;
};

// Answers a request from a thread outside CAF, as the promise would from inside its actor
// (response_promise::deliver needs the actor's own execution unit).
void deliver_from_outside(Waiter& w, caf::message msg) {
  if (!w.stages.empty()) {
    auto next = std::move(w.stages.back());
    w.stages.pop_back();
    next->enqueue(caf::make_mailbox_element(std::move(w.source), w.id, std::move(w.stages), std::move(msg)),
                  nullptr);
  } else if (w.source) {
    w.source->enqueue(nullptr, w.id.response_id(), std::move(msg), nullptr);
  }
}

}  // namespace

// ---- gpu side: what a lane's actor, its lane shards and its reader thread share ----------------

// Lane shards write their requests themselves and the reader thread answers the requesters
// straight away: no request or answer waits for another thread on its way (each such hand-over
// costs tens of microseconds, as much as a megabyte on the wire).
class LaneLink {
 public:
  LaneLink(std::shared_ptr<lane::Socket> sock, std::string node, caf::timespan timeout)
      : sock_(std::move(sock)), node_(std::move(node)), timeout_(timeout) {}
  const lane::Socket& socket() const { return *sock_; }
  const std::string& node() const { return node_; }
  caf::timespan timeout() const { return timeout_; }

  // A ticket for the request `w` answers; 0 when the lane is closed (`why` says why).
  uint64_t enter(Waiter w, std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_.empty()) {
      why = closed_;
      return 0;
    }
    const uint64_t ticket = ++next_ticket_;
    waiting_.emplace(ticket, std::move(w));
    return ticket;
  }

  // Sends one request frame whole; closes the lane when the connection fails.
  void write(uint64_t ticket, uint32_t shard, const Buffer& meta, const Buffer* const payload[lane::kPayloads]) {
    try {
      std::lock_guard<std::mutex> lock(write_mu_);
      lane::write_frame(*sock_, FrameKind::request, ticket, shard, meta, payload);
    } catch (const Error& e) {
      close(e.what());
    }
  }

  // The answer of a ticket; false when it expired meanwhile.
  bool answer(uint64_t ticket, caf::message msg) {
    Waiter w;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = waiting_.find(ticket);
      if (it == waiting_.end()) return false;
      w = std::move(it->second);
      waiting_.erase(it);
    }
    deliver_from_outside(w, std::move(msg));
    return true;
  }

  // Fails the requests whose deadline has passed.
  void expire(std::chrono::steady_clock::time_point now) {
    std::vector<Waiter> late;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (it->second.deadline > now) {
          ++it;
          continue;
        }
        late.push_back(std::move(it->second));
        it = waiting_.erase(it);
      }
    }
    for (auto& w : late) deliver_from_outside(w, caf::make_message(caf::make_error(caf::sec::request_timeout)));
  }

  // Fails every request in flight as if its shard had gone down (the micro-batch then re-places
  // the sequences) and shuts the socket: a blocked write returns, the reader thread ends.
  void close(const std::string& why) {
    std::unordered_map<uint64_t, Waiter> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_.empty()) closed_ = "data lane to " + node_ + " closed: " + why;
      failed.swap(waiting_);
    }
    sock_->shutdown();
    for (auto& [ticket, w] : failed)
      deliver_from_outside(w, caf::make_message(caf::make_error(caf::sec::request_receiver_down, closed_)));
  }

  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return !closed_.empty();
  }

 private:
  std::shared_ptr<lane::Socket> sock_;
  std::string node_;
  caf::timespan timeout_;  // per request
  std::mutex write_mu_;  // frames are written whole, one at a time
  std::mutex mu_;        // guards what follows
  std::unordered_map<uint64_t, Waiter> waiting_;  // by ticket
  uint64_t next_ticket_ = 0;
  std::string closed_;   // why the lane closed; empty while open
};

namespace {

constexpr auto kSweep = 100ms;  // how often a lane fails requests past their deadline

// The cpu node's answers, straight to the requesters.
void read_answers(caf::actor_system& sys, std::shared_ptr<LaneLink> link, lane_actor lane) {
  std::string why = read_frames(link->socket(), "the cpu node closed its data lane", [&](lane::Frame& f) {
    if (f.kind == FrameKind::reply) {
      attn_reply r;
      if (!decode(sys, f.meta, r.step, r.layer, r.compute_us))
        throw Error("data lane: malformed reply from the cpu node");
      r.o = std::move(f.payload[0]);
      link->answer(f.ticket, caf::make_message(std::move(r)));
    } else if (f.kind == FrameKind::failure) {
      caf::error err;
      if (!decode(sys, f.meta, err) || !err) throw Error("data lane: malformed failure from the cpu node");
      link->answer(f.ticket, caf::make_message(std::move(err)));
    } else {
      throw Error("data lane: unexpected frame from the cpu node");
    }
  });
  link->close(why);
  caf::anon_send(lane, lane_closed{why});
}

// ---- gpu side: one lane actor per cpu node ------------------------------------------------

struct LaneState {
  std::shared_ptr<LaneLink> link;
  std::thread reader;
  bool claimed = false;
  size_t watched = 0;  // lane shards still alive
  std::unordered_set<caf::actor_addr> remotes;  // the remote shards still alive
  ~LaneState() {
    if (link) link->close("the gpu node closed it");
    if (reader.joinable()) reader.join();
  }
  static inline const char* name = "data_lane";
};

using lane_ptr = lane_actor::stateful_pointer<LaneState>;

void end_lane(lane_ptr self, const std::string& why) {
  self->state.link->close(why);
  self->quit(caf::make_error(caf::sec::runtime_error, "data lane to " + self->state.link->node() + " closed: " + why));
}

lane_actor::behavior_type lane_behavior(lane_ptr self, std::shared_ptr<LaneLink> link) {
  auto& st = self->state;
  st.link = link;
  st.reader = std::thread(read_answers, std::ref(self->system()), link, caf::actor_cast<lane_actor>(self));
  self->delayed_send(self, kClaimTimeout, expire_atom::value);
  self->delayed_send(self, kSweep, tick_atom::value);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.remotes.erase(dm.source) > 0) {
      // Every shard of the node is gone: so is the node, and a write to it must not block.
      if (st.remotes.empty()) end_lane(self, "its node is gone");
    } else if (--st.watched == 0) {
      end_lane(self, "its shards are gone");
    }
  });
  return {
      [self](lane_closed& c) { end_lane(self, c.why); },
      [self](tick_atom) {
        self->state.link->expire(std::chrono::steady_clock::now());
        self->delayed_send(self, kSweep, tick_atom::value);
      },
      [self](expire_atom) {
        if (!self->state.claimed) end_lane(self, "no shards registered for it");
      },
      [self](watch_atom, std::vector<shard_actor>& fronts) {
        auto& st = self->state;
        st.claimed = true;
        for (auto& s : fronts) {
          self->monitor(s);
          ++st.watched;
        }
        if (st.watched == 0) end_lane(self, "no shards registered for it");
      },
      [self](watch_atom, shard_actor& remote) {
        self->monitor(remote);
        self->state.remotes.insert(remote.address());
      },
  };
}

// ---- gpu side: a lane shard per remote shard ------------------------------------------------

struct LaneShardState {
  shard_actor remote;
  Lane lane;
  int32_t index = 0;
  static inline const char* name = "lane_shard";
};

shard_actor::behavior_type lane_shard_behavior(shard_actor::stateful_pointer<LaneShardState> self,
                                               shard_actor remote, Lane lane, int32_t index) {
  self->state.remote = remote;
  self->state.lane = lane;
  self->state.index = index;
  self->link_to(remote);
  self->monitor(lane.actor);
  self->set_down_handler([self](caf::down_msg& dm) {
    self->quit(dm.reason ? dm.reason : caf::make_error(caf::sec::request_receiver_down, "data lane closed"));
  });
  return {
      [self](attn_request& r) -> caf::result<attn_reply> {
        auto& st = self->state;
        caf::response_promise rp = self->make_response_promise();
        std::string why;
        const uint64_t ticket = st.lane.link->enter(
            Waiter{rp.source(), rp.stages(), rp.id(), std::chrono::steady_clock::now() + st.lane.link->timeout()}, why);
        if (ticket == 0) {
          rp.deliver(caf::make_error(caf::sec::request_receiver_down, why));
          return rp;
        }
        const Buffer meta = encode(self->system(), r.step, r.layer, r.seqs);
        const Buffer* payload[lane::kPayloads] = {&r.q, &r.k, &r.v};
        st.lane.link->write(ticket, static_cast<uint32_t>(st.index), meta, payload);
        return rp;  // answered by the lane's reader thread, its sweep or its close
      },
      [self](drop_atom, uint64_t seq) { self->send(self->state.remote, drop_atom::value, seq); },
      [self](stats_atom) { return self->delegate(self->state.remote, stats_atom::value); },
  };
}

// ---- cpu side: the lane server ----------------------------------------------------------------

// The cpu side's socket, shared by its reader thread and the shards' answers.
struct ServerLink {
  std::shared_ptr<lane::Socket> sock;
  std::mutex write_mu;  // frames are written whole, one at a time

  // Writes one answer; a connection that fails is shut down (the reader thread then ends the
  // server, and the gpu node sees the lane close).
  void answer(caf::actor_system& sys, uint64_t ticket, attn_reply* reply, caf::error* err) {
    try {
      std::lock_guard<std::mutex> lock(write_mu);
      if (reply != nullptr) {
        const Buffer meta = encode(sys, reply->step, reply->layer, reply->compute_us);
        const Buffer* payload[lane::kPayloads] = {&reply->o, nullptr, nullptr};
        lane::write_frame(*sock, FrameKind::reply, ticket, 0, meta, payload);
      } else {
        write_small(*sock, FrameKind::failure, ticket, encode(sys, *err));
      }
    } catch (const Error& e) {
      std::cerr << "data lane: " << e.what() << "\n";
      sock->shutdown();
    }
  }
};

// The gpu node's requests go to the shards straight from the reader thread, as requests from
// `replies`, whose answers are written to the socket on the shard's own thread.
void read_requests(caf::actor_system& sys, std::shared_ptr<ServerLink> link, std::vector<shard_actor> shards,
                   caf::strong_actor_ptr replies, lane_server_actor server) {
  std::string why = read_frames(*link->sock, "the gpu node closed the data lane", [&](lane::Frame& f) {
    if (f.kind != FrameKind::request) throw Error("data lane: unexpected frame from the gpu node");
    if (f.ticket == 0 || f.ticket > caf::message_id::request_id_mask)
      throw Error("data lane: request with a bad ticket from the gpu node");
    if (f.target >= shards.size()) {
      auto err = caf::make_error(caf::sec::invalid_argument,
                                 "data lane: this node has no shard " + std::to_string(f.target));
      return link->answer(sys, f.ticket, nullptr, &err);
    }
    attn_request r;
    if (!decode(sys, f.meta, r.step, r.layer, r.seqs))
      throw Error("data lane: malformed request from the gpu node");
    r.q = std::move(f.payload[0]);
    r.k = std::move(f.payload[1]);
    r.v = std::move(f.payload[2]);
    // The ticket is the request's id: the answer to `replies` carries it back.
    auto shard = caf::actor_cast<caf::strong_actor_ptr>(shards[f.target]);
    shard->enqueue(caf::make_mailbox_element(replies, caf::make_message_id(f.ticket), {}, std::move(r)),
                   nullptr);
  });
  caf::anon_send(server, lane_closed{why});
}

struct LaneServerState {
  LaneEnd end;
  caf::actor replies;  // a companion: takes the shards' answers on their own threads
  caf::actor_companion* companion() { return static_cast<caf::actor_companion*>(caf::actor_cast<caf::abstract_actor*>(replies)); }
  ~LaneServerState() {
    if (replies) {
      companion()->on_enqueue([](caf::mailbox_element_ptr) {});  // answers after the end are dropped
      caf::scoped_execution_unit eu;
      companion()->cleanup(caf::exit_reason::user_shutdown, &eu);
    }
  }
  static inline const char* name = "data_lane_server";
};

using server_ptr = lane_server_actor::stateful_pointer<LaneServerState>;

lane_server_actor::behavior_type lane_server_behavior(server_ptr self, std::shared_ptr<lane::Socket> sock,
                                                      std::vector<shard_actor> shards) {
  auto& st = self->state;
  auto link = std::make_shared<ServerLink>();
  link->sock = sock;
  st.end.sock = sock;
  auto& sys = self->system();
  st.replies = sys.spawn<caf::actor_companion, caf::hidden>();
  st.companion()->on_enqueue([&sys, link](caf::mailbox_element_ptr m) {
    if (!m || !m->mid.is_response()) return;
    const uint64_t ticket = m->mid.request_id().integer_value();
    auto& msg = m->content();
    if (msg.match_elements<attn_reply>())
      link->answer(sys, ticket, &msg.get_mutable_as<attn_reply>(0), nullptr);
    else if (msg.match_elements<caf::error>())
      link->answer(sys, ticket, nullptr, &msg.get_mutable_as<caf::error>(0));
  });
  st.end.reader = std::thread(read_requests, std::ref(sys), link, std::move(shards),
                              caf::actor_cast<caf::strong_actor_ptr>(st.replies),
                              caf::actor_cast<lane_server_actor>(self));
  return {
      [self](lane_closed&) { self->quit(); },
  };
}

}  // namespace

void LaneRegistry::put(uint64_t key, Lane lane) {
  std::lock_guard<std::mutex> lock(mu_);
  lanes_[key] = std::move(lane);
}

Lane LaneRegistry::take(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = lanes_.find(key);
  if (it == lanes_.end()) return {};
  Lane out = std::move(it->second);
  lanes_.erase(it);
  return out;
}

LaneAcceptor::LaneAcceptor(caf::actor_system& sys, LaneAcceptorConfig cfg)
    : sys_(sys), cfg_(std::move(cfg)) {
  listener_ = lane::listen_tcp(cfg_.host, cfg_.port);
  thread_ = std::thread([this] { run(); });
}

LaneAcceptor::~LaneAcceptor() {
  stop_ = true;
  thread_.join();
  // A lane blocked writing to a stopped node returns once its socket is shut down.
  for (auto& [lane, sock] : lanes_) {
    sock->shutdown();
    caf::anon_send_exit(lane, caf::exit_reason::user_shutdown);
  }
}

void LaneAcceptor::run() {
  while (!stop_) {
    lane::Socket s = lane::accept_tcp(listener_, 200ms);
    if (s.fd() >= 0) handshake(std::move(s));
  }
}

// Runs on the acceptor's thread: a peer gets kHandshakeTimeout to say hello.
void LaneAcceptor::handshake(lane::Socket s) {
  lane::set_io_timeouts(s, kHandshakeTimeout, kHandshakeTimeout);
  lane_hello h;
  std::string why;
  try {
    lane::Frame f;
    // A hello is small and carries no tensors: a stranger gets nothing allocated beyond that.
    if (!lane::read_frame(s, f, kMaxHello, 0)) return;
    if (f.kind != FrameKind::hello || !decode(sys_, f.meta, h))
      why = "the peer did not begin with a lane hello";
    else if (h.version != kProtocolVersion)
      why = "protocol version mismatch: this gpu node speaks version " + std::to_string(kProtocolVersion) +
            ", the peer " + std::to_string(h.version);
    else if (!same_secret(h.token, cfg_.token))
      why = "wrong cluster secret (--token / FASTDECODE_TOKEN)";
    else if (h.run_id != cfg_.run_id)
      why = "the node joined an earlier run of this gpu node";
    else if (h.key == 0)
      why = "the hello names no lane key";
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty()) {
    if (cfg_.log) std::cerr << "data lane: refused " << (h.node.empty() ? "a peer" : h.node) << ": " << why << "\n";
    try {
      write_small(s, FrameKind::refused, 0, encode(sys_, why));
    } catch (const Error&) {
    }
    return;
  }
  lane::set_io_timeouts(s, ms(cfg_.timeout), 0ms);
  auto sock = std::make_shared<lane::Socket>(std::move(s));
  auto link = std::make_shared<LaneLink>(sock, h.node, cfg_.timeout);
  auto lane = sys_.spawn<caf::detached>(lane_behavior, link);
  lanes_.emplace_back(lane, sock);
  registry_->put(h.key, Lane{lane, link});  // before the welcome: the node registers its shards only after it
  try {
    write_small(*sock, FrameKind::welcome, 0, Buffer{});
  } catch (const Error& e) {
    caf::anon_send(lane, lane_closed{e.what()});
  }
}

shard_actor spawn_lane_shard(caf::actor_system& sys, shard_actor remote, const Lane& lane, int32_t index) {
  // Detached: it writes to the socket, which may block while the cpu node catches up.
  auto front = sys.spawn<caf::detached>(lane_shard_behavior, remote, lane, index);
  caf::anon_send(lane.actor, watch_atom::value, std::move(remote));
  return front;
}

lane_server_actor connect_lane(caf::actor_system& sys, const std::string& host, uint16_t port,
                               const lane_hello& hello, std::vector<shard_actor> shards,
                               caf::timespan timeout) {
  auto sock = std::make_shared<lane::Socket>(lane::connect_tcp(host, port));
  lane::set_io_timeouts(*sock, kHandshakeTimeout, kHandshakeTimeout);
  lane_hello h = hello;
  write_small(*sock, FrameKind::hello, 0, encode(sys, h));
  lane::Frame f;
  if (!lane::read_frame(*sock, f))
    throw Error("the gpu node closed the data lane at " + host + ":" + std::to_string(port) +
                " without an answer");
  if (f.kind == FrameKind::refused) {
    std::string why;
    decode(sys, f.meta, why);
    throw Error("the gpu node refused the data lane: " + why);
  }
  if (f.kind != FrameKind::welcome) throw Error("the gpu node answered the lane hello with a wrong frame");
  lane::set_io_timeouts(*sock, ms(timeout), 0ms);
  return sys.spawn<caf::detached>(lane_server_behavior, sock, std::move(shards));
}

}  // namespace fd
