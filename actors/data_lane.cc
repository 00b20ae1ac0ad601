#include "actors/data_lane.h"

#include <pthread.h>

#include <algorithm>
#include <iostream>
#include <condition_variable>
#include <optional>
#include <utility>

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

// The requests in flight on one lane, by ticket. Whoever writes a request's frame (a lane shard or
// the lane actor) adds it; the reader thread answers it; the lane actor fails those past their
// deadline, or all of them when the lane closes. Each is taken out once, so it is answered once.
class PendingRequests {
 public:
  using Clock = std::chrono::steady_clock;
  struct Request {
    caf::strong_actor_ptr to;  // the requester (a lane shard passes its sender on)
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

}  // namespace

// What a lane's actor and its lane shards share: the socket, the requests in flight, and who
// writes. Frames go out one at a time and in order: a lane shard writes its request in its
// sender's thread when no write is under way, none waits at the lane actor and the socket has
// room for the frame; otherwise the lane actor writes it (so a peer that stops reading blocks the
// lane actor's thread, not the requester's).
struct LaneWire {
  std::shared_ptr<lane::Socket> sock;
  PendingRequests pending;
  caf::timespan timeout{};
  std::atomic<uint64_t> next_ticket{0};
  std::atomic<bool> sweeping{false};  // a sweep_atom is on its way to the lane actor
  std::atomic<bool> closed{false};    // requests registered now are failed by whoever added them
  std::mutex mu;
  std::condition_variable idle;
  bool writing = false;  // guarded by mu
  size_t queued = 0;     // requests handed to the lane actor, not yet written; guarded by mu

  // Registers the request of `to` (message `mid`) for the node's shard `shard` and writes its
  // frame; the caller holds the writer (writing), which this hands back. Registered first: the
  // answer may come before the write returns. When the connection fails, or the lane closed
  // meanwhile, the request is failed here (as from `from`) if nobody answered it yet. Returns why
  // the connection failed, or "".
  std::string send(caf::actor_system& sys, const caf::strong_actor_ptr& from, caf::strong_actor_ptr to,
                   caf::message_id mid, int32_t shard, attn_request& req) {
    const uint64_t ticket = ++next_ticket;
    pending.add(ticket, {std::move(to), mid, std::chrono::steady_clock::now() + timeout});
    std::string failed;
    try {
      const Buffer meta = encode(sys, req.step, req.layer, req.seqs);
      const Buffer* payload[lane::kPayloads] = {&req.q, &req.k, &req.v};
      lane::write_frame(*sock, FrameKind::request, ticket, static_cast<uint32_t>(shard), meta, payload);
    } catch (const Error& e) {
      failed = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      writing = false;
    }
    idle.notify_all();
    if (failed.empty() && !closed) return failed;
    if (auto r = pending.take(ticket))
      r->respond(from, caf::make_message(caf::make_error(caf::sec::request_receiver_down,
                                                         failed.empty() ? "data lane closed" : failed)));
    return failed;
  }
};

namespace {

struct LaneState {
  LaneEnd end;
  std::shared_ptr<LaneWire> wire;
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
  ::pthread_setname_np(::pthread_self(), "fd.lane.reader");  // for top -H and profiles
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
void read_answers(caf::actor_system& sys, std::shared_ptr<LaneWire> wire, lane_actor lane) {
  const auto from = caf::actor_cast<caf::strong_actor_ptr>(lane);
  read_frames(wire->sock, lane, "the cpu node closed its data lane", [&](lane::Frame& f) {
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
    if (auto req = wire->pending.take(f.ticket)) req->respond(from, std::move(answer));  // else expired meanwhile
  });
}

// Fails every request in flight as if its shard had gone down (the micro-batch then re-places
// the sequences), and ends the lane: its lane shards end with it.
void close_lane(lane_ptr self, const std::string& why) {
  auto& st = self->state;
  const auto err = caf::make_error(caf::sec::request_receiver_down, "data lane to " + st.node + ": " + why);
  const auto from = caf::actor_cast<caf::strong_actor_ptr>(self);
  st.wire->closed = true;  // before take_all: a request added later is failed by its writer
  for (auto& req : st.wire->pending.take_all()) req.respond(from, caf::make_message(err));
  self->quit(caf::make_error(caf::sec::runtime_error, "data lane to " + st.node + " closed: " + why));
}

// Makes sure a sweep is under way while requests are in flight (a timer per request would wake
// CAF's clock thread once per request).
void ensure_sweep(LaneWire& w, const lane_actor& lane) {
  if (!w.sweeping.exchange(true)) caf::anon_send(lane, sweep_atom::value);
}

lane_actor::behavior_type lane_behavior(lane_ptr self, std::shared_ptr<LaneWire> wire, std::string node) {
  auto& st = self->state;
  st.end.sock = wire->sock;
  st.wire = wire;
  st.node = std::move(node);
  st.end.reader = std::thread(read_answers, std::ref(self->system()), wire, caf::actor_cast<lane_actor>(self));
  self->delayed_send(self, kClaimTimeout, expire_atom::value);
  self->set_down_handler([self](caf::down_msg&) {
    if (--self->state.watched == 0) close_lane(self, "its shards are gone");
  });
  return {
      // The requests a lane shard could not write itself, in the order they came.
      [self](lane_atom, int32_t shard, attn_request& req) -> caf::result<attn_reply> {
        LaneWire& w = *self->state.wire;
        {
          std::unique_lock<std::mutex> lock(w.mu);
          w.idle.wait(lock, [&] { return !w.writing; });
          w.writing = true;
          --w.queued;
        }
        const auto* asked = self->current_mailbox_element();
        const std::string failed =
            w.send(self->system(), caf::actor_cast<caf::strong_actor_ptr>(self), asked->sender, asked->mid, shard, req);
        if (failed.empty())
          ensure_sweep(w, caf::actor_cast<lane_actor>(self));
        else
          close_lane(self, failed);
        return caf::delegated<attn_reply>();  // the reader thread (or send, or close_lane) answers
      },
      [self](lane_closed& c) { close_lane(self, c.why); },
      [self](expire_atom) {
        if (!self->state.claimed) close_lane(self, "no shards registered for it");
      },
      [self](sweep_atom) {
        LaneWire& w = *self->state.wire;
        const auto from = caf::actor_cast<caf::strong_actor_ptr>(self);
        for (auto& req : w.pending.take_expired(std::chrono::steady_clock::now()))
          req.respond(from, caf::make_message(caf::make_error(caf::sec::request_timeout)));
        w.sweeping = false;
        if (!w.pending.empty() && !w.sweeping.exchange(true))
          self->delayed_send(self, sweep_period(w.timeout), sweep_atom::value);
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

// The shard_actor that stands for remote shard `index` of a lane's cpu node. Like CAF's own actor
// proxies it has no mailbox: it handles each message in the sender's thread, so a request costs
// no scheduling hop of its own (each hop wakes a thread, about 8 us of CPU on two cores), and
// mostly it writes the request itself (LaneWire). Attention goes over the lane, everything else
// to the remote shard over CAF.
class LaneShard final : public caf::monitorable_actor {
 public:
  LaneShard(caf::actor_config& cfg, shard_actor remote, Lane lane, int32_t index)
      : caf::monitorable_actor(cfg), links_{std::move(remote), std::move(lane.actor), std::move(lane.wire)},
        index_(index) {}

  const char* name() const override { return "lane_shard"; }

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* host) override {
    const Links l = links();
    if (!l.lane) return bounce(what, caf::make_error(caf::sec::request_receiver_down, "data lane closed"));
    auto& content = what->content();
    if (content.match_elements<attn_request>()) {
      // Moved out unless someone else holds the message (then copied, as CAF would).
      attn_request req = content.shared() ? content.get_as<attn_request>(0)
                                          : std::move(content.get_mutable_as<attn_request>(0));
      if (!try_write(l, what, req))
        caf::actor_cast<caf::abstract_actor*>(l.lane)->enqueue(
            caf::make_mailbox_element(std::move(what->sender), what->mid, std::move(what->stages),
                                      lane_atom::value, index_, std::move(req)),
            host);
    } else if (content.match_elements<caf::exit_msg>()) {
      // From the remote shard it is linked to (or a kill): a normal exit of a link ends nothing.
      const caf::error& reason = content.get_as<caf::exit_msg>(0).reason;
      if (reason) quit(reason, host);
    } else {
      caf::actor_cast<caf::abstract_actor*>(l.remote)->enqueue(std::move(what), host);  // drops, stats
    }
  }

  // Ends it once: requests in flight on the lane are the lane's to answer. What it holds goes
  // now, as a stateful actor's state would: a lane shard someone still refers to must not keep
  // the lane actor (detached: CAF 0.17 awaits its destruction when the system shuts down), the
  // remote shard's proxy or the socket.
  void quit(caf::error reason, caf::execution_unit* host) {
    Links gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!links_.lane) return;
      gone = std::exchange(links_, Links{});
    }
    cleanup(std::move(reason), host);
  }

 private:
  struct Links {
    shard_actor remote;
    lane_actor lane;  // null once it went down
    std::shared_ptr<LaneWire> wire;
  };

  Links links() {
    std::lock_guard<std::mutex> lock(mu_);
    return links_;
  }

  // Writes the request in this thread when the lane lets it (see LaneWire); false: the lane actor
  // must (it was counted as queued there).
  bool try_write(const Links& l, caf::mailbox_element_ptr& what, attn_request& req) {
    LaneWire& w = *l.wire;
    const size_t bytes = req.q.size() + req.k.size() + req.v.size() + 64 * (req.seqs.size() + 1);
    {
      std::lock_guard<std::mutex> lock(w.mu);
      if (w.writing || w.queued > 0 || lane::send_room(*w.sock) < bytes) {
        ++w.queued;
        return false;
      }
      w.writing = true;
    }
    const std::string failed =
        w.send(home_system(), caf::actor_cast<caf::strong_actor_ptr>(this), what->sender, what->mid, index_, req);
    if (!failed.empty())
      caf::anon_send(l.lane, lane_closed{failed});
    else if (!w.closed)
      ensure_sweep(w, l.lane);
    return true;
  }

  std::mutex mu_;
  Links links_;  // guarded by mu_
  int32_t index_;
};

// ---- cpu side: the lane server ----------------------------------------------------------------

// Writes the node's answers to the lane in the thread that answers (the shard's own): the reader
// thread puts each request in its shard's mailbox as a request from this actor under the frame's
// ticket, so the shard's response comes here and goes out without another hop. Like LaneShard it
// has no mailbox of its own.
class LaneReplier final : public caf::monitorable_actor {
 public:
  LaneReplier(caf::actor_config& cfg, std::shared_ptr<lane::Socket> sock)
      : caf::monitorable_actor(cfg), sock_(std::move(sock)) {}

  const char* name() const override { return "data_lane_replier"; }

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit*) override {
    if (!what->mid.is_response()) return;  // only answers are meant for it
    const uint64_t ticket = what->mid.request_id().integer_value();
    auto& content = what->content();
    if (content.match_elements<attn_reply>())
      reply(ticket, content.get_as<attn_reply>(0));
    else if (content.match_elements<caf::error>())
      fail(ticket, content.get_as<caf::error>(0));
    else
      fail(ticket, caf::make_error(caf::sec::unexpected_response, "data lane: a shard answered with a wrong type"));
  }

  void reply(uint64_t ticket, const attn_reply& r) {
    const Buffer meta = encode(home_system(), r.step, r.layer, r.compute_us);
    const Buffer* payload[lane::kPayloads] = {&r.o, nullptr, nullptr};
    write(FrameKind::reply, ticket, meta, payload);
  }

  void fail(uint64_t ticket, caf::error err) { write(FrameKind::failure, ticket, encode(home_system(), err), nullptr); }

 private:
  // A connection that fails is shut down: the reader thread ends and tells the lane server.
  void write(FrameKind kind, uint64_t ticket, const Buffer& meta, const Buffer* const payload[lane::kPayloads]) {
    std::lock_guard<std::mutex> lock(write_mu_);
    try {
      lane::write_frame(*sock_, kind, ticket, 0, meta, payload);
    } catch (const Error& e) {
      std::cerr << "data lane: " << e.what() << "\n";
      sock_->shutdown();
    }
  }

  std::shared_ptr<lane::Socket> sock_;
  std::mutex write_mu_;  // shards answer from their own threads
};

struct LaneServerState {
  LaneEnd end;
  static inline const char* name = "data_lane_server";
};

using server_ptr = lane_server_actor::stateful_pointer<LaneServerState>;

// The gpu node's requests, each put straight into its shard's mailbox.
void read_requests(caf::actor_system& sys, std::shared_ptr<lane::Socket> sock, lane_server_actor server,
                   std::vector<shard_actor> shards, caf::strong_actor_ptr from) {
  auto* replier = static_cast<LaneReplier*>(caf::actor_cast<caf::abstract_actor*>(from));
  read_frames(std::move(sock), server, "the gpu node closed the data lane", [&](lane::Frame& f) {
    if (f.kind != FrameKind::request) throw Error("data lane: unexpected frame from the gpu node");
    if (f.ticket == 0 || f.ticket > caf::message_id::request_id_mask)
      throw Error("data lane: a request from the gpu node has no valid ticket");
    attn_request r;
    if (!decode(sys, f.meta, r.step, r.layer, r.seqs))
      throw Error("data lane: malformed request from the gpu node");
    if (f.target >= shards.size())
      return replier->fail(f.ticket, caf::make_error(caf::sec::invalid_argument, "data lane: this node has no shard " +
                                                                                    std::to_string(f.target)));
    r.q = std::move(f.payload[0]);
    r.k = std::move(f.payload[1]);
    r.v = std::move(f.payload[2]);
    caf::actor_cast<caf::abstract_actor*>(shards[f.target])
        ->enqueue(caf::make_mailbox_element(from, caf::make_message_id(f.ticket), {}, std::move(r)), nullptr);
  });
}

lane_server_actor::behavior_type lane_server_behavior(server_ptr self, std::shared_ptr<lane::Socket> sock,
                                                      std::vector<shard_actor> shards) {
  auto& st = self->state;
  st.end.sock = sock;
  caf::actor_config cfg;
  auto replier = caf::make_actor<LaneReplier, caf::strong_actor_ptr>(self->system().next_actor_id(),
                                                                     self->system().node(), &self->system(), cfg, sock);
  st.end.reader = std::thread(read_requests, std::ref(self->system()), sock,
                              caf::actor_cast<lane_server_actor>(self), std::move(shards), std::move(replier));
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
  auto wire = std::make_shared<LaneWire>();
  wire->sock = sock;
  wire->timeout = cfg_.timeout;
  auto lane = sys_.spawn<caf::detached>(lane_behavior, wire, h.node);
  {
    std::lock_guard<std::mutex> lock(lanes_mu_);
    lanes_.emplace_back(lane, sock);
  }
  registry_->put(h.key, Lane{lane, wire});  // before the welcome: the node registers its shards only after it
  try {
    write_small(*sock, FrameKind::welcome, 0, Buffer{});
  } catch (const Error& e) {
    caf::anon_send(lane, lane_closed{e.what()});
  }
}

shard_actor spawn_lane_shard(caf::actor_system& sys, shard_actor remote, const Lane& lane,
                             int32_t index) {
  caf::actor_config cfg;
  auto ptr = caf::make_actor<LaneShard, caf::strong_actor_ptr>(sys.next_actor_id(), sys.node(), &sys, cfg,
                                                               remote, lane, index);
  auto* shard = static_cast<LaneShard*>(caf::actor_cast<caf::abstract_actor*>(ptr));
  shard->link_to(remote);
  // Ends with the lane (the functor holds no reference, so a lane shard dropped early is freed).
  auto weak = caf::actor_cast<caf::weak_actor_ptr>(ptr);
  caf::actor_cast<caf::abstract_actor*>(lane.actor)->attach_functor([weak](const caf::error& reason) {
    if (auto alive = caf::actor_cast<caf::strong_actor_ptr>(weak))
      static_cast<LaneShard*>(caf::actor_cast<caf::abstract_actor*>(alive))
          ->quit(reason ? reason : caf::make_error(caf::sec::request_receiver_down, "data lane closed"), nullptr);
  });
  return caf::actor_cast<shard_actor>(std::move(ptr));
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
