#include "actors/data_lane.h"

#include <algorithm>
#include <iostream>
#include <optional>

#include "actors/gatekeeper.h"
#include "caf/all.hpp"
#include "runtime/error.h"

namespace fd {
namespace {

using namespace std::chrono_literals;
using lane::Buffer;
using lane::FrameKind;

constexpr auto kHandshakeTimeout = 5s;  // for a connecting peer to say hello
constexpr auto kClaimTimeout = 60s;     // for a welcomed node to register its shards
constexpr size_t kMaxHello = 64 << 10;  // bytes of a hello's metadata
constexpr size_t kMaxHandshakes = 16;   // peers saying hello at once

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

// ---- gpu side: one lane actor per cpu node ------------------------------------------------

// The requests in flight on one lane, by ticket. The lane actor adds them and fails those past
// their deadline or all of them when the lane closes; its reader thread answers them. Each is
// taken out once, so it is answered once.
class PendingRequests {
 public:
  using Clock = std::chrono::steady_clock;
  struct Request {
    caf::strong_actor_ptr to;  // the requester (a lane shard delegates, so not the lane shard)
    caf::message_id mid;       // of the request
    Clock::time_point deadline;
    // Sends the answer (a reply or an error) as the response to the request.
    void respond(const caf::strong_actor_ptr& from, caf::message answer) {
      if (to && mid.is_request())
        to->enqueue(caf::make_mailbox_element(from, mid.response_id(), {}, std::move(answer)), nullptr);
    }
  };
  void add(uint64_t ticket, Request r) {
    std::lock_guard<std::mutex> lock(mu_);
    by_ticket_.emplace(ticket, std::move(r));
  }
  std::optional<Request> take(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_ticket_.find(ticket);
    if (it == by_ticket_.end()) return std::nullopt;
    Request r = std::move(it->second);
    by_ticket_.erase(it);
    return r;
  }
  std::vector<Request> take_expired(Clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Request> out;
    for (auto it = by_ticket_.begin(); it != by_ticket_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      out.push_back(std::move(it->second));
      it = by_ticket_.erase(it);
    }
    return out;
  }
  std::vector<Request> take_all() { return take_expired(Clock::time_point::max()); }
  bool empty() {
    std::lock_guard<std::mutex> lock(mu_);
    return by_ticket_.empty();
  }

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, Request> by_ticket_;
};

// How often a lane with requests in flight looks for expired ones: a timer per request would wake
// CAF's clock thread once per request.
caf::timespan sweep_period(caf::timespan timeout) {
  return std::clamp<caf::timespan>(timeout / 8, std::chrono::milliseconds(10), std::chrono::seconds(1));
}

struct LaneState {
  LaneEnd end;
  std::shared_ptr<PendingRequests> pending = std::make_shared<PendingRequests>();
  uint64_t next_ticket = 0;
  caf::timespan timeout{};
  bool sweeping = false;  // a sweep_atom is on its way
  std::string node;
  bool claimed = false;
  size_t watched = 0;  // lane shards still alive
  static inline const char* name = "data_lane";
};

using lane_ptr = lane_actor::stateful_pointer<LaneState>;

// Hands each frame that arrives to `on_frame` (which throws fd::Error for one it cannot take)
// until the connection ends; then tells `to` why.
template <class Actor, class OnFrame>
void read_frames(std::shared_ptr<lane::Socket> sock, Actor to, const char* closed, OnFrame on_frame) {
  std::string why = closed;
  try {
    lane::Frame f;
    while (lane::read_frame(*sock, f)) on_frame(f);
  } catch (const Error& e) {
    why = e.what();
  } catch (const std::exception& e) {  // e.g. no memory for a frame: the lane closes, nothing else
    why = std::string("data lane: cannot take a frame: ") + e.what();
  }
  caf::anon_send(to, lane_closed{why});
}

// The cpu node's answers, each sent from here straight to its requester: through the lane actor
// it waited until the actor had written the frame in hand (on two cores about 0.2 ms for a 1 MiB
// request), and with two requests in flight the next one then left that much later.
void read_answers(caf::actor_system& sys, std::shared_ptr<lane::Socket> sock, lane_actor lane,
                  std::shared_ptr<PendingRequests> pending) {
  const auto from = caf::actor_cast<caf::strong_actor_ptr>(lane);
  read_frames(std::move(sock), lane, "the cpu node closed its data lane", [&](lane::Frame& f) {
    caf::message answer;
    if (f.kind == FrameKind::reply) {
      attn_reply r;
      if (!decode(sys, f.meta, r.step, r.layer, r.compute_us))
        throw Error("data lane: malformed reply from the cpu node");
      r.o = std::move(f.payload[0]);
      answer = caf::make_message(std::move(r));
    } else if (f.kind == FrameKind::failure) {
      caf::error err;
      if (!decode(sys, f.meta, err) || !err) throw Error("data lane: malformed failure from the cpu node");
      answer = caf::make_message(std::move(err));
    } else {
      throw Error("data lane: unexpected frame from the cpu node");
    }
    if (auto req = pending->take(f.ticket)) req->respond(from, std::move(answer));  // else expired meanwhile
  });
}

// Fails every request in flight as if its shard had gone down (the micro-batch then re-places
// the sequences), and ends the lane: its lane shards end with it.
void close_lane(lane_ptr self, const std::string& why) {
  auto& st = self->state;
  const auto err = caf::make_error(caf::sec::request_receiver_down, "data lane to " + st.node + ": " + why);
  const auto from = caf::actor_cast<caf::strong_actor_ptr>(self);
  for (auto& req : st.pending->take_all()) req.respond(from, caf::make_message(err));
  self->quit(caf::make_error(caf::sec::runtime_error, "data lane to " + st.node + " closed: " + why));
}

lane_actor::behavior_type lane_behavior(lane_ptr self, std::shared_ptr<lane::Socket> sock,
                                        std::string node, caf::timespan timeout) {
  auto& st = self->state;
  st.end.sock = sock;
  st.node = std::move(node);
  st.timeout = timeout;
  st.end.reader = std::thread(read_answers, std::ref(self->system()), sock,
                              caf::actor_cast<lane_actor>(self), st.pending);
  self->delayed_send(self, kClaimTimeout, expire_atom::value);
  self->set_down_handler([self](caf::down_msg&) {
    if (--self->state.watched == 0) close_lane(self, "its shards are gone");
  });
  return {
      [self](lane_atom, int32_t shard, attn_request& req) -> caf::result<attn_reply> {
        auto& st = self->state;
        const uint64_t ticket = ++st.next_ticket;
        // Registered before the frame is written: its answer may come before the write returns.
        const auto* asked = self->current_mailbox_element();
        st.pending->add(ticket, {asked->sender, asked->mid, std::chrono::steady_clock::now() + st.timeout});
        try {
          const Buffer meta = encode(self->system(), req.step, req.layer, req.seqs);
          const Buffer* payload[lane::kPayloads] = {&req.q, &req.k, &req.v};
          lane::write_frame(*st.end.sock, FrameKind::request, ticket, static_cast<uint32_t>(shard), meta, payload);
        } catch (const Error& e) {
          st.pending->take(ticket);
          close_lane(self, e.what());
          return caf::make_error(caf::sec::request_receiver_down, e.what());
        }
        if (!st.sweeping) {
          st.sweeping = true;
          self->delayed_send(self, sweep_period(st.timeout), sweep_atom::value);
        }
        return caf::delegated<attn_reply>();  // the reader thread answers
      },
      [self](lane_closed& c) { close_lane(self, c.why); },
      [self](expire_atom) {
        if (!self->state.claimed) close_lane(self, "no shards registered for it");
      },
      [self](sweep_atom) {
        auto& st = self->state;
        const auto from = caf::actor_cast<caf::strong_actor_ptr>(self);
        for (auto& req : st.pending->take_expired(std::chrono::steady_clock::now()))
          req.respond(from, caf::make_message(caf::make_error(caf::sec::request_timeout)));
        st.sweeping = !st.pending->empty();
        if (st.sweeping) self->delayed_send(self, sweep_period(st.timeout), sweep_atom::value);
      },
      [self](watch_atom, std::vector<shard_actor>& shards) {
        auto& st = self->state;
        st.claimed = true;
        for (auto& s : shards) {
          self->monitor(s);
          ++st.watched;
        }
        if (st.watched == 0) close_lane(self, "no shards registered for it");
      },
  };
}

// ---- gpu side: a lane shard per remote shard ------------------------------------------------

struct LaneShardState {
  shard_actor remote;
  lane_actor lane;
  int32_t index = 0;
  static inline const char* name = "lane_shard";
};

shard_actor::behavior_type lane_shard_behavior(shard_actor::stateful_pointer<LaneShardState> self,
                                               shard_actor remote, lane_actor lane, int32_t index) {
  self->state.remote = remote;
  self->state.lane = lane;
  self->state.index = index;
  self->link_to(remote);
  self->monitor(lane);
  self->set_down_handler([self](caf::down_msg& dm) {
    self->quit(dm.reason ? dm.reason : caf::make_error(caf::sec::request_receiver_down, "data lane closed"));
  });
  return {
      [self](attn_request& r) {
        return self->delegate(self->state.lane, lane_atom::value, self->state.index, std::move(r));
      },
      [self](drop_atom, uint64_t seq) { self->send(self->state.remote, drop_atom::value, seq); },
      [self](stats_atom) { return self->delegate(self->state.remote, stats_atom::value); },
  };
}

// ---- cpu side: the lane server ----------------------------------------------------------------

struct LaneServerState {
  LaneEnd end;
  std::vector<shard_actor> shards;
  caf::timespan timeout{};
  static inline const char* name = "data_lane_server";
};

using server_ptr = lane_server_actor::stateful_pointer<LaneServerState>;

// The gpu node's requests.
void read_requests(caf::actor_system& sys, std::shared_ptr<lane::Socket> sock, lane_server_actor server) {
  read_frames(std::move(sock), server, "the gpu node closed the data lane", [&](lane::Frame& f) {
    if (f.kind != FrameKind::request) throw Error("data lane: unexpected frame from the gpu node");
    lane_request r;
    r.ticket = f.ticket;
    r.shard = static_cast<int32_t>(f.target);
    if (!decode(sys, f.meta, r.req.step, r.req.layer, r.req.seqs))
      throw Error("data lane: malformed request from the gpu node");
    r.req.q = std::move(f.payload[0]);
    r.req.k = std::move(f.payload[1]);
    r.req.v = std::move(f.payload[2]);
    caf::anon_send(server, std::move(r));
  });
}

// Writes one answer; a connection that fails ends the server (the gpu node then sees it close).
void answer(server_ptr self, uint64_t ticket, attn_reply* reply, caf::error* err) {
  auto& st = self->state;
  try {
    if (reply != nullptr) {
      const Buffer meta = encode(self->system(), reply->step, reply->layer, reply->compute_us);
      const Buffer* payload[lane::kPayloads] = {&reply->o, nullptr, nullptr};
      lane::write_frame(*st.end.sock, FrameKind::reply, ticket, 0, meta, payload);
    } else {
      write_small(*st.end.sock, FrameKind::failure, ticket, encode(self->system(), *err));
    }
  } catch (const Error& e) {
    std::cerr << "data lane: " << e.what() << "\n";
    self->quit();
  }
}

lane_server_actor::behavior_type lane_server_behavior(server_ptr self, std::shared_ptr<lane::Socket> sock,
                                                      std::vector<shard_actor> shards,
                                                      caf::timespan timeout) {
  auto& st = self->state;
  st.end.sock = sock;
  st.shards = std::move(shards);
  st.timeout = timeout;
  st.end.reader = std::thread(read_requests, std::ref(self->system()), sock,
                          caf::actor_cast<lane_server_actor>(self));
  return {
      [self](lane_request& r) {
        auto& st = self->state;
        const uint64_t ticket = r.ticket;
        if (r.shard < 0 || static_cast<size_t>(r.shard) >= st.shards.size()) {
          auto err = caf::make_error(caf::sec::invalid_argument,
                                           "data lane: this node has no shard " + std::to_string(r.shard));
          return answer(self, ticket, nullptr, &err);
        }
        self->request(st.shards[static_cast<size_t>(r.shard)], st.timeout, std::move(r.req))
            .then([self, ticket](attn_reply& rep) { answer(self, ticket, &rep, nullptr); },
                  [self, ticket](caf::error& e) { answer(self, ticket, nullptr, &e); });
      },
      [self](lane_closed&) { self->quit(); },
  };
}

}  // namespace

void LaneRegistry::put(uint64_t key, lane_actor lane) {
  std::lock_guard<std::mutex> lock(mu_);
  lanes_[key] = std::move(lane);
}

lane_actor LaneRegistry::take(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = lanes_.find(key);
  if (it == lanes_.end()) return {};
  lane_actor out = std::move(it->second);
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
  std::lock_guard<std::mutex> lock(lanes_mu_);
  for (auto& [lane, sock] : lanes_) {
    sock->shutdown();
    caf::anon_send_exit(lane, caf::exit_reason::user_shutdown);
  }
}

void LaneAcceptor::run() {
  while (!stop_) {
    lane::Socket s = lane::accept_tcp(listener_, 200ms);
    reap_handshakes(false);
    if (s.fd() < 0) continue;
    if (handshakes_.size() >= kMaxHandshakes) {
      if (cfg_.log) std::cerr << "data lane: refused a peer: " << kMaxHandshakes << " others are saying hello\n";
      continue;  // closed unanswered
    }
    Handshake h{std::make_shared<lane::Socket>(std::move(s)), std::make_shared<std::atomic<bool>>(false), {}};
    h.thread = std::thread([this, sock = h.sock, done = h.done] {
      handshake(sock);
      *done = true;
    });
    handshakes_.push_back(std::move(h));
  }
  reap_handshakes(true);
}

void LaneAcceptor::reap_handshakes(bool all) {
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    if (!all && !*it->done) {
      ++it;
      continue;
    }
    if (all) it->sock->shutdown();
    it->thread.join();
    it = handshakes_.erase(it);
  }
}

// Runs on a thread of its own: a peer gets kHandshakeTimeout to say hello.
void LaneAcceptor::handshake(const std::shared_ptr<lane::Socket>& sock) {
  lane::Socket& s = *sock;
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
  auto lane = sys_.spawn<caf::detached>(lane_behavior, sock, h.node, cfg_.timeout);
  {
    std::lock_guard<std::mutex> lock(lanes_mu_);
    lanes_.emplace_back(lane, sock);
  }
  registry_->put(h.key, lane);  // before the welcome: the node registers its shards only after it
  try {
    write_small(*sock, FrameKind::welcome, 0, Buffer{});
  } catch (const Error& e) {
    caf::anon_send(lane, lane_closed{e.what()});
  }
}

shard_actor spawn_lane_shard(caf::actor_system& sys, shard_actor remote, lane_actor lane,
                             int32_t index) {
  return sys.spawn(lane_shard_behavior, std::move(remote), std::move(lane), index);
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
  return sys.spawn<caf::detached>(lane_server_behavior, sock, std::move(shards), timeout);
}

}  // namespace fd
