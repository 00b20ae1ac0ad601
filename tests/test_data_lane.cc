// The data lane: its frames on a socket pair, its handshake (secret, version, run), and attention
// through a lane shard against the same request sent to a shard directly.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "actors/data_lane.h"
#include "actors/system.h"
#include "caf/all.hpp"
#include "runtime/error.h"
#include "runtime/lane_socket.h"

namespace {

using fd::lane::Buffer;
using fd::lane::FrameKind;

std::pair<fd::lane::Socket, fd::lane::Socket> socket_pair() {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  return {fd::lane::Socket(fds[0]), fd::lane::Socket(fds[1])};
}

Buffer pattern(size_t n, int seed) {
  Buffer b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>(i * 131 + static_cast<size_t>(seed));
  return b;
}

constexpr uint64_t kRun = 42;

// One shard's worth of shape: 2 layers, 4 heads over 2 kv heads of 16.
fd::ShardConfig shard_config(const std::string& name) {
  fd::ShardConfig c;
  c.name = name;
  c.kv = fd::KvStoreConfig{2, 2, 16, 16, size_t(1) << 20, fd::kernels::KvDtype::f16};
  c.dims = fd::kernels::AttnDims{4, 2, 16};
  return c;
}

// A request of `rows` new tokens for sequence 7 at layer 0, with random Q/K/V.
fd::attn_request random_request(int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  fd::attn_request r;
  r.step = 3;
  r.layer = 0;
  r.seqs = {fd::seq_rows{7, 0, rows}};
  std::vector<float> q(size_t(rows) * 4 * 16);
  std::vector<uint16_t> k(size_t(rows) * 2 * 16), v(k.size());
  for (auto& x : q) x = dist(rng);
  for (auto& x : k) x = static_cast<uint16_t>(0x3000 + rng() % 0x0800);
  for (auto& x : v) x = static_cast<uint16_t>(0xB000 + rng() % 0x0800);
  r.q = fd::to_bytes(q.data(), q.size());
  r.k = fd::to_bytes(k.data(), k.size());
  r.v = fd::to_bytes(v.data(), v.size());
  return r;
}

fd::attn_reply ask(caf::scoped_actor& self, const fd::shard_actor& to, fd::attn_request r) {
  fd::attn_reply out;
  self->request(to, std::chrono::seconds(10), std::move(r))
      .receive([&](fd::attn_reply& x) { out = std::move(x); },
               [&](caf::error& e) { FAIL("attention request failed: " << self->system().render(e)); });
  return out;
}

struct LaneFixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<fd::LaneAcceptor> acceptor;
  // `timeout`: how long a request through the lane may wait for its answer.
  explicit LaneFixture(caf::timespan timeout = std::chrono::seconds(10)) {
    fd::configure_caf(cfg, 2);
    sys = std::make_unique<caf::actor_system>(cfg);
    acceptor = std::make_unique<fd::LaneAcceptor>(
        *sys, fd::LaneAcceptorConfig{"127.0.0.1", 0, "s3cret", kRun, timeout, false});
  }
  fd::lane_server_actor connect(fd::lane_hello h, std::vector<fd::shard_actor> shards) {
    return fd::connect_lane(*sys, "127.0.0.1", acceptor->port(), h, std::move(shards),
                            std::chrono::seconds(10));
  }
  // A cpu node's lane under `key` serving `far` as its shard 0, and the lane shard in front of it.
  struct Opened {
    fd::lane_server_actor server;
    fd::Lane lane;
    fd::shard_actor front;
  };
  Opened open(uint64_t key, const fd::shard_actor& far) {
    Opened o;
    o.server = connect({"s3cret", fd::kProtocolVersion, kRun, key, "cpu"}, {far});
    o.lane = acceptor->registry()->take(key);
    REQUIRE(o.lane);
    o.front = fd::spawn_lane_shard(*sys, far, o.lane, 0);
    caf::anon_send(o.lane.actor, fd::watch_atom::value, std::vector<fd::shard_actor>{o.front});
    return o;
  }
};

}  // namespace

TEST_CASE("lane frames keep their kind, ticket, target, metadata and payloads", "[lane]") {
  auto [a, b] = socket_pair();
  const Buffer meta = pattern(37, 1), p0 = pattern(300001, 2), p2 = pattern(5, 3), empty;
  const Buffer* payload[fd::lane::kPayloads] = {&p0, &empty, &p2};
  std::thread writer([&, &a = a] {
    fd::lane::write_frame(a, FrameKind::request, 99, 5, meta, payload);
    fd::lane::write_frame(a, FrameKind::welcome, 0, 0, Buffer{}, nullptr);
    a.shutdown();
  });
  fd::lane::Frame f;
  REQUIRE(fd::lane::read_frame(b, f));
  CHECK(f.kind == FrameKind::request);
  CHECK(f.ticket == 99);
  CHECK(f.target == 5);
  CHECK(f.meta == meta);
  CHECK(f.payload[0] == p0);
  CHECK(f.payload[1].empty());
  CHECK(f.payload[2] == p2);
  REQUIRE(fd::lane::read_frame(b, f));
  CHECK(f.kind == FrameKind::welcome);
  CHECK(f.meta.empty());
  CHECK(f.payload[0].empty());
  CHECK_FALSE(fd::lane::read_frame(b, f));  // closed between frames
  writer.join();
}

TEST_CASE("malformed lane frames are refused with a clear error", "[lane]") {
  const auto refused = [](const std::vector<char>& bytes, const char* what) {
    auto [a, b] = socket_pair();
    REQUIRE(::write(a.fd(), bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    a.shutdown();
    fd::lane::Frame f;
    std::string err;
    try {
      fd::lane::read_frame(b, f);
    } catch (const fd::Error& e) {
      err = e.what();
    }
    INFO(err);
    CHECK(err.find(what) != std::string::npos);
  };
  // A valid header to start from: magic "FDDL", kind reply, ticket 1, no metadata or payload.
  std::vector<char> h(48, 0);
  const uint32_t magic = 0x4C444446, kind = 5;
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &kind, 4);
  auto bad_magic = h;
  bad_magic[0] = 'X';
  refused(bad_magic, "does not speak the lane protocol");
  auto bad_kind = h;
  bad_kind[4] = 77;
  refused(bad_kind, "unknown frame kind");
  auto huge_meta = h;
  const uint32_t meta = 1u << 30;
  std::memcpy(huge_meta.data() + 20, &meta, 4);
  refused(huge_meta, "metadata too large");
  auto huge_payload = h;
  const uint64_t payload = uint64_t(1) << 40;
  std::memcpy(huge_payload.data() + 32, &payload, 8);
  refused(huge_payload, "payload too large");
  auto cut = h;
  const uint64_t ten = 10;
  std::memcpy(cut.data() + 24, &ten, 8);
  cut.push_back('x');  // 1 of 10 payload bytes, then the end
  refused(cut, "in the middle of a frame");
  refused(std::vector<char>(h.begin(), h.begin() + 20), "in the middle of a frame");
}

TEST_CASE("the data lane refuses a wrong secret, version or run and stays open for others", "[lane]") {
  LaneFixture fx;
  const auto refusal = [&](fd::lane_hello h) {
    std::string err = "(accepted)";
    try {
      fx.connect(h, {});
    } catch (const fd::Error& e) {
      err = e.what();
    }
    return err;
  };
  CHECK(refusal({"wrong", fd::kProtocolVersion, kRun, 1, "n"}).find("wrong cluster secret") != std::string::npos);
  CHECK(refusal({"s3cret", fd::kProtocolVersion + 1, kRun, 1, "n"}).find("protocol version") != std::string::npos);
  CHECK(refusal({"s3cret", fd::kProtocolVersion, kRun + 1, 1, "n"}).find("earlier run") != std::string::npos);
  CHECK(refusal({"s3cret", fd::kProtocolVersion, kRun, 0, "n"}).find("no lane key") != std::string::npos);
  CHECK_FALSE(fx.acceptor->registry()->take(1));  // nothing refused got through
  {  // A stranger's hello that announces a tensor is refused before anything is allocated for it.
    auto big = fd::lane::connect_tcp("127.0.0.1", fx.acceptor->port());
    std::vector<char> h(48, 0);
    const uint32_t magic = 0x4C444446, kind = 1;
    const uint64_t huge = uint64_t(1) << 31;
    std::memcpy(h.data(), &magic, 4);
    std::memcpy(h.data() + 4, &kind, 4);
    std::memcpy(h.data() + 24, &huge, 8);
    REQUIRE(::write(big.fd(), h.data(), h.size()) == static_cast<ssize_t>(h.size()));
    fd::lane::Frame f;
    REQUIRE(fd::lane::read_frame(big, f));
    CHECK(f.kind == FrameKind::refused);
  }
  {  // A peer that sends junk is dropped.
    auto junk = fd::lane::connect_tcp("127.0.0.1", fx.acceptor->port());
    const char bytes[64] = "GET / HTTP/1.0\r\n\r\n";
    REQUIRE(::write(junk.fd(), bytes, sizeof bytes) == static_cast<ssize_t>(sizeof bytes));
    char c;
    CHECK(::read(junk.fd(), &c, 1) >= 0);  // answered (refused) or closed, not hanging
  }
  auto server = fx.connect({"s3cret", fd::kProtocolVersion, kRun, 9, "good"}, {});
  CHECK(server);
  CHECK(fx.acceptor->registry()->take(9));
  caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
}

TEST_CASE("a peer that never says hello does not delay the next node's lane", "[lane]") {
  LaneFixture fx;
  auto silent = fd::lane::connect_tcp("127.0.0.1", fx.acceptor->port());  // gets 5 s to say hello
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  auto server = fx.connect({"s3cret", fd::kProtocolVersion, kRun, 12, "next"}, {});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(server);
  CHECK(fx.acceptor->registry()->take(12));
  CHECK(waited < 2.0);
  caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
}

TEST_CASE("attention through a lane shard equals the shard's own answer, and the lane's end ends it", "[lane]") {
  LaneFixture fx;
  caf::scoped_actor self{*fx.sys};
  auto far = fd::spawn_shard(*fx.sys, shard_config("far"));      // behind the lane
  auto direct = fd::spawn_shard(*fx.sys, shard_config("near"));  // asked directly
  auto [server, lane, front] = fx.open(5, far);

  for (int rows : {3, 1}) {  // a prefill, then one decode step
    auto r = random_request(rows, static_cast<uint32_t>(rows));
    if (rows == 1) r.seqs[0].pos0 = 3;
    const auto via_lane = ask(self, front, r);
    const auto straight = ask(self, direct, r);
    CHECK(via_lane.step == straight.step);
    CHECK(via_lane.layer == straight.layer);
    CHECK(via_lane.o.size() == size_t(rows) * 4 * 16 * sizeof(float));
    CHECK(via_lane.o == straight.o);
  }
  // A request the far shard rejects comes back as its error.
  auto bad = random_request(2, 9);
  bad.layer = 5;
  std::string err;
  self->request(front, std::chrono::seconds(10), bad)
      .receive([](fd::attn_reply&) {}, [&](caf::error& e) { err = fx.sys->render(e); });
  CHECK(err.find("does not match the model shape") != std::string::npos);

  // The cpu side goes away: the lane closes and the lane shard goes down with it.
  self->monitor(front);
  caf::anon_send_exit(server, caf::exit_reason::kill);
  bool down = false;
  self->receive([&](caf::down_msg& dm) { down = dm.source == front.address(); },
                caf::after(std::chrono::seconds(10)) >> [] {});
  CHECK(down);
  caf::anon_send_exit(far, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(direct, caf::exit_reason::user_shutdown);
}

// The race CI met: the gpu node's end reaches a cpu shard through its lane shard's link before
// the cpu node asks it what it served, so the shard must say so itself as it stops.
TEST_CASE("a shard stopped through its lane shard's link sends its node its last figures, then goes down", "[lane]") {
  LaneFixture fx;
  caf::scoped_actor self{*fx.sys};
  auto cfg = shard_config("far");
  cfg.report_to = caf::actor_cast<caf::actor>(self);
  auto far = fd::spawn_shard(*fx.sys, cfg);
  self->monitor(far);
  auto [server, lane, front] = fx.open(6, far);
  auto r = random_request(3, 1);
  ask(self, front, r);
  r = random_request(1, 2);
  r.seqs[0].pos0 = 3;
  ask(self, front, r);

  caf::anon_send_exit(lane.actor, caf::exit_reason::user_shutdown);  // as the gpu node does on ending
  std::vector<std::string> seen;  // what reached the node, in order
  fd::shard_stats last;
  for (int i = 0; i < 2; ++i)
    self->receive([&](fd::shard_stats& st) {
                    seen.push_back("stats");
                    last = st;
                  },
                  [&](caf::down_msg& dm) { seen.push_back(dm.source == far.address() ? "down" : "other down"); },
                  caf::after(std::chrono::seconds(10)) >> [&] { seen.push_back("nothing"); });
  CHECK(seen == std::vector<std::string>{"stats", "down"});
  CHECK(last.name == "far");
  CHECK(last.requests == 2);
  CHECK(last.served == 1);
  CHECK(last.tokens == 4);
  caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
}

TEST_CASE("requests through one lane from several threads each get their own answer", "[lane]") {
  LaneFixture fx;
  auto far0 = fd::spawn_shard(*fx.sys, shard_config("far0")), far1 = fd::spawn_shard(*fx.sys, shard_config("far1"));
  auto near0 = fd::spawn_shard(*fx.sys, shard_config("near0")), near1 = fd::spawn_shard(*fx.sys, shard_config("near1"));
  auto server = fx.connect({"s3cret", fd::kProtocolVersion, kRun, 6, "cpu"}, {far0, far1});
  auto lane = fx.acceptor->registry()->take(6);
  REQUIRE(lane);
  std::vector<fd::shard_actor> fronts{fd::spawn_lane_shard(*fx.sys, far0, lane, 0),
                                      fd::spawn_lane_shard(*fx.sys, far1, lane, 1)};
  caf::anon_send(lane.actor, fd::watch_atom::value, fronts);
  // Each thread drives its own sequence on its own shard pair: prefill, then decode steps, so
  // every answer depends on the KV-cache its own earlier requests built.
  std::vector<int> mismatches(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      caf::scoped_actor self{*fx.sys};
      const auto& near = t == 0 ? near0 : near1;
      for (int i = 0; i < 20; ++i) {
        auto r = random_request(i == 0 ? 5 : 1, static_cast<uint32_t>(100 * t + i));
        r.seqs[0].pos0 = i == 0 ? 0 : 4 + i;
        const auto a = ask(self, fronts[static_cast<size_t>(t)], r), b = ask(self, near, r);
        if (a.o != b.o || a.o.empty()) ++mismatches[static_cast<size_t>(t)];
      }
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>{0, 0});
  for (auto& a : {far0, far1, near0, near1}) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
}

// A shard that never answers.
fd::shard_actor::behavior_type mute_shard() {
  return {
      [](fd::attn_request&) -> caf::result<fd::attn_reply> { return caf::delegated<fd::attn_reply>(); },
      [](fd::drop_atom, uint64_t) {},
      [](fd::stats_atom) { return fd::shard_stats{}; },
  };
}

TEST_CASE("a lane request without an answer times out, one for a shard the node lacks fails", "[lane]") {
  LaneFixture fx(std::chrono::milliseconds(300));
  caf::scoped_actor self{*fx.sys};
  auto mute = fx.sys->spawn(mute_shard);
  auto [server, lane, front] = fx.open(8, mute);
  auto stray = fd::spawn_lane_shard(*fx.sys, mute, lane, 3);  // the node has no shard 3
  caf::anon_send(lane.actor, fd::watch_atom::value, std::vector<fd::shard_actor>{stray});
  const auto error_of = [&](const fd::shard_actor& to) {
    std::string err;
    self->request(to, std::chrono::seconds(10), random_request(1, 1))
        .receive([](fd::attn_reply&) {}, [&](caf::error& e) { err = fx.sys->render(e); });
    return err;
  };
  const auto t0 = std::chrono::steady_clock::now();
  const std::string late = error_of(front);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(late);
  CHECK(late.find("request_timeout") != std::string::npos);
  CHECK(waited >= 0.3);
  CHECK(waited < 3.0);  // the lane's deadline, not the requester's 10 s
  const std::string lacking = error_of(stray);
  INFO(lacking);
  CHECK(lacking.find("has no shard 3") != std::string::npos);
  caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(mute, caf::exit_reason::user_shutdown);
}

// A shard that answers every request with its own Q as O, and counts the drops it gets.
struct EchoState {
  uint64_t drops = 0;
};
fd::shard_actor::behavior_type echo_shard(fd::shard_actor::stateful_pointer<EchoState> self) {
  return {
      [](fd::attn_request& r) {
        fd::attn_reply out;
        out.step = r.step;
        out.layer = r.layer;
        out.o = std::move(r.q);
        return out;
      },
      [self](fd::drop_atom, uint64_t) { ++self->state.drops; },
      [self](fd::stats_atom) {
        fd::shard_stats s;
        s.name = "echo";
        s.sequences = self->state.drops;
        return s;
      },
  };
}

TEST_CASE("requests larger than the socket buffer, many in flight, each get their own payload back", "[lane]") {
  // A frame that does not fit the socket's free send buffer is written by the lane actor, and so
  // is every request sent while one waits there (they keep their order); one sent alone afterwards
  // is written in the requester's thread. Every answer must carry its own request's payload.
  LaneFixture fx;
  caf::scoped_actor self{*fx.sys};
  auto echo = fx.sys->spawn(echo_shard);
  auto [server, lane, front] = fx.open(9, echo);
  const std::vector<size_t> sizes{size_t(8) << 20, 4096, size_t(6) << 20, 64, 4096, size_t(3) << 20};
  using Handle = decltype(self->request(front, std::chrono::seconds(10), fd::attn_request{}));
  std::vector<Handle> inflight;
  for (size_t i = 0; i < sizes.size(); ++i) {
    fd::attn_request r;
    r.step = i;
    r.q = pattern(sizes[i], static_cast<int>(i));
    inflight.push_back(self->request(front, std::chrono::seconds(10), std::move(r)));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("request " << i << " of " << sizes[i] << " bytes");
    bool same = false;
    inflight[i].receive([&](fd::attn_reply& r) { same = r.step == i && r.o == pattern(sizes[i], static_cast<int>(i)); },
                        [&](caf::error& e) { FAIL("lane request failed: " << fx.sys->render(e)); });
    CHECK(same);
  }
  fd::attn_request alone;
  alone.step = 99;
  alone.q = pattern(4096, 99);
  CHECK(ask(self, front, alone).o == pattern(4096, 99));
  // Drops and stats pass the lane shard on to the remote shard itself.
  self->send(front, fd::drop_atom::value, uint64_t{1});
  self->send(front, fd::drop_atom::value, uint64_t{2});
  uint64_t drops = 0;
  self->request(front, std::chrono::seconds(10), fd::stats_atom::value)
      .receive([&](fd::shard_stats& s) { drops = s.name == "echo" ? s.sequences : 0; },
               [&](caf::error& e) { FAIL("stats through the lane shard failed: " << fx.sys->render(e)); });
  CHECK(drops == 2);
  caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}
