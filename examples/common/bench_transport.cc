#include "examples/common/bench_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/data_lane.h"
#include "actors/system.h"
#include "runtime/lane_socket.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "examples/common/json.h"
#include "examples/common/stats.h"
#include "examples/common/list_options.h"
#include "runtime/error.h"

namespace po = boost::program_options;

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t(1) << 20;
// attn_request::layer tells the sink what to answer.
constexpr int32_t kAck = 0;   // an empty reply
constexpr int32_t kEcho = 1;  // the payload back
constexpr uint64_t kRunId = 1;  // of the data lane between the two processes

struct Options {
  bool json = false;
  bool serve = false;  // hidden: this process is the far side
  std::vector<int> sizes_mb{1, 4, 16, 64};
  int reps = 0;  // 0: enough for about 512 MiB per size, at least 5
  int small_kb = 4;
  int small_reps = 2000;
  int window = 2;  // transfers in flight for the throughput figures
  bool lane = true, basp = true, tcp = true;  // the paths measured (--paths)
  // CAF settings to try against the project's (configure_caf / configure_network); -1 keeps them.
  int mm_workers = -1;     // middleman.workers: BASP deserialization threads
  int poll_attempts = -1;  // work-stealing.aggressive-poll-attempts
};

std::vector<int> parse_sizes(const std::string& text) { return parse_int_list(text, "sizes", 1, 1024); }

// Returns false when --help was printed.
bool parse_options(int argc, char** argv, Options& o) {
  po::options_description desc("fastdecode-bench transport [options]");
  desc.add_options()
      ("help,h", "show this help")
      ("json", po::bool_switch(&o.json), "one JSON object per line instead of a table")
      ("sizes", po::value<std::string>()->default_value("1,4,16,64"), "payload sizes in MiB")
      ("reps", po::value<int>(&o.reps)->default_value(0), "transfers per size and path (0: auto)")
      ("small-kb", po::value<int>(&o.small_kb)->default_value(4), "small payload in KiB")
      ("small-reps", po::value<int>(&o.small_reps)->default_value(2000), "small round trips per path")
      ("paths", po::value<std::string>()->default_value("actor,basp,tcp"),
       "the paths measured, of actor, basp and tcp (one alone, e.g. to profile it; a path left out "
       "shows 0)")
      ("window", po::value<int>(&o.window)->default_value(2),
       "transfers in flight for the throughput figures (2: the pipeline's two mini-batches)")
      ("mm-workers", po::value<int>(&o.mm_workers)->default_value(-1),
       "override middleman.workers in both processes (-1: the project's setting)")
      ("poll-attempts", po::value<int>(&o.poll_attempts)->default_value(-1),
       "override work-stealing.aggressive-poll-attempts in both processes (-1: the project's)");
  po::options_description hidden;
  hidden.add_options()("serve", po::bool_switch(&o.serve), "");
  po::options_description all;
  all.add(desc).add(hidden);
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, all), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc << "\n"
              << "Starts a second process on loopback that serves a typed shard actor, as a cpu node\n"
                 "does, and sends each payload size to it three ways, rep by rep: as an attn_request\n"
                 "through the actor path a micro-batch uses for a remote shard (a lane shard, the data\n"
                 "lane's socket, the lane server, the shard; actors/data_lane.h), as the same request\n"
                 "straight to the remote actor through CAF's BASP, and as raw bytes over a plain TCP\n"
                 "socket answered by one byte. The shard answers with an empty attn_reply.\n"
                 "Throughput (MiB/s, ratio = actor over TCP): reps transfers per path with --window of\n"
                 "them in flight, each sent when an earlier one is answered, median of 3 rounds.\n"
                 "One-at-a-time (1-by-1): the payload over the median time of a single transfer and its\n"
                 "ack. echo_ms is the median round trip when the payload comes back. cpu: CPU time of\n"
                 "both processes per streamed transfer (where two cores bound the speed, this is what\n"
                 "a path costs). The small payload's\n"
                 "round trip is what each layer's shard hop costs; overhead is actor minus TCP.\n";
    return false;
  }
  o.sizes_mb = parse_sizes(vm["sizes"].as<std::string>());
  o.lane = o.basp = o.tcp = false;
  std::stringstream paths(vm["paths"].as<std::string>());
  for (std::string p; std::getline(paths, p, ',');) {
    if (p == "actor") o.lane = true;
    else if (p == "basp") o.basp = true;
    else if (p == "tcp") o.tcp = true;
    else throw Error("--paths: unknown path '" + p + "' (known: actor, basp, tcp)");
  }
  if (!o.lane && !o.basp && !o.tcp) throw Error("--paths names no path (known: actor, basp, tcp)");
  if (o.reps < 0 || o.small_kb < 1 || o.small_reps < 1 || o.window < 1)
    throw Error("--reps must not be negative, --small-kb, --small-reps and --window must be positive.");
  return true;
}

// The project's CAF configuration, with the overrides of the command line.
void configure(caf::actor_system_config& cfg, const Options& o) {
  configure_caf(cfg, 2);
  configure_network(cfg, std::chrono::seconds(60));
  if (o.mm_workers >= 0) cfg.set("middleman.workers", static_cast<size_t>(o.mm_workers));
  if (o.poll_attempts >= 0)
    cfg.set("work-stealing.aggressive-poll-attempts", static_cast<size_t>(o.poll_attempts));
}

// ---- plain TCP ------------------------------------------------------------------------------

struct RawHeader {
  uint64_t size = 0;
  uint64_t mode = 0;  // kAck or kEcho
};

void send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error(std::string("TCP send failed: ") + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// False when the peer closed the connection before the first byte.
bool recv_all(int fd, char* p, size_t n) {
  const size_t want = n;
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && n == want) return false;
    if (r <= 0) throw Error(std::string("TCP receive failed: ") + std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// The far side of the TCP path: reads each payload whole into one reused buffer (as a receiver
// of tensors would), then answers with one byte or the payload.
void serve_raw(int listen_fd) {
  std::vector<char> buf;
  for (;;) {
    const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    no_delay(c);
    try {
      RawHeader h;
      while (recv_all(c, reinterpret_cast<char*>(&h), sizeof h)) {
        if (buf.size() < h.size) buf.resize(h.size);
        if (!recv_all(c, buf.data(), h.size)) break;
        if (h.mode == kEcho) {
          send_all(c, buf.data(), h.size);
        } else {
          const char ack = 1;
          send_all(c, &ack, 1);
        }
      }
    } catch (const Error&) {
    }
    ::close(c);
  }
}

// ---- actor path -----------------------------------------------------------------------------

// The far side of the actor path: a typed actor with the R-worker shard's interface.
shard_actor::behavior_type sink_behavior(shard_actor::pointer) {
  return {
      [](attn_request& r) {
        attn_reply out;
        out.step = r.step;
        out.layer = r.layer;
        if (r.layer == kEcho) out.o = std::move(r.q);
        return out;
      },
      [](drop_atom, uint64_t) {},
      [](stats_atom) { return shard_stats{}; },
  };
}

// `--serve`: publishes the sink and a TCP listener on loopback, prints both ports on stdout,
// reads "LANE-PORT KEY" from stdin and opens the data lane to the parent as a cpu node would,
// then serves until stdin closes (the parent exits or is done).
int serve_main(const Options& o) {
  caf::actor_system_config cfg;
  configure(cfg, o);
  caf::actor_system sys{cfg};
  auto sink = sys.spawn(sink_behavior);
  auto port = sys.middleman().publish(sink, 0, "127.0.0.1", true);
  if (!port) throw Error("cannot publish the sink actor: " + sys.render(port.error()));
  uint16_t raw_port = 0;
  const int lfd = lane::listen_tcp("127.0.0.1", raw_port).release();
  std::thread raw([lfd] { serve_raw(lfd); });
  std::printf("%u %u\n", static_cast<unsigned>(*port), static_cast<unsigned>(raw_port));
  std::fflush(stdout);
  std::string line;
  for (char c; ::read(0, &c, 1) > 0 && c != '\n';) line += c;
  unsigned lane_port = 0;
  unsigned long long key = 0;
  lane_server_actor lane;
  if (std::sscanf(line.c_str(), "%u %llu", &lane_port, &key) == 2)
    lane = connect_lane(sys, "127.0.0.1", static_cast<uint16_t>(lane_port),
                        lane_hello{"", kProtocolVersion, kRunId, key, "bench"}, {sink},
                        std::chrono::seconds(120));
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  ::shutdown(lfd, SHUT_RDWR);  // wakes accept()
  raw.join();
  ::close(lfd);
  if (lane) caf::anon_send_exit(lane, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
  return 0;
}

struct Server {
  pid_t pid = -1;
  int to_child = -1;  // closing it ends the server
  uint16_t actor_port = 0;
  uint16_t raw_port = 0;
};

// fork + exec of this binary with --serve; reads the two ports it prints.
Server start_server(const Options& o) {
  const std::string workers = std::to_string(o.mm_workers), polls = std::to_string(o.poll_attempts);
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
    throw Error(std::string("cannot create pipes: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("cannot fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the benchmark
    ::execl("/proc/self/exe", "fastdecode-bench", "transport", "--serve", "--mm-workers",
            workers.c_str(), "--poll-attempts", polls.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  Server s;
  s.pid = pid;
  s.to_child = in[1];
  std::string line;
  pollfd p{out[0], POLLIN, 0};
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (line.find('\n') == std::string::npos && Clock::now() < deadline) {
    if (::poll(&p, 1, 1000) <= 0) continue;
    char buf[64];
    const ssize_t r = ::read(out[0], buf, sizeof buf);
    if (r <= 0) break;
    line.append(buf, static_cast<size_t>(r));
  }
  ::close(out[0]);
  unsigned a = 0, b = 0;
  if (std::sscanf(line.c_str(), "%u %u", &a, &b) != 2 || a == 0 || b == 0 || a > 65535 || b > 65535) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    throw Error("the transport server process did not start (it printed '" + line + "')");
  }
  s.actor_port = static_cast<uint16_t>(a);
  s.raw_port = static_cast<uint16_t>(b);
  return s;
}

void stop_server(Server& s) {
  if (s.pid < 0) return;
  ::close(s.to_child);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  int status = 0;
  while (::waitpid(s.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(s.pid, SIGKILL);
      ::waitpid(s.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  s.pid = -1;
}

// Times transfers over the three paths, each including its answer: one at a time, or a stream
// with a window of them in flight.
class Paths {
 public:
  Paths(caf::actor_system& sys, Server& server)
      : sys_(sys),
        self_(sys),
        acceptor_(sys, LaneAcceptorConfig{"127.0.0.1", 0, "", kRunId, std::chrono::seconds(120), true}) {
    auto sink = sys.middleman().remote_actor<shard_actor>("127.0.0.1", server.actor_port);
    if (!sink) throw Error("cannot reach the sink actor: " + sys.render(sink.error()));
    // The data lane, opened by the server as a cpu node opens it to a gpu node.
    const uint64_t key = 0x5eed;
    const std::string line = std::to_string(acceptor_.port()) + " " + std::to_string(key) + "\n";
    if (::write(server.to_child, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      throw Error("cannot tell the transport server the lane port");
    Lane lane;
    for (int i = 0; i < 1000 && !lane; ++i) {
      lane = acceptor_.registry()->take(key);
      if (!lane) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!lane) throw Error("the transport server did not open its data lane");
    front_ = spawn_lane_shard(sys, *sink, lane, 0);
    caf::anon_send(lane.actor, watch_atom::value, std::vector<shard_actor>{front_});
    // Sent untyped so that one prebuilt message carries the payload every time (as the
    // micro-batch's request would): the far side still checks it against shard_actor.
    lane_ = caf::actor_cast<caf::actor>(front_);
    basp_ = caf::actor_cast<caf::actor>(*sink);
    raw_ = lane::connect_tcp("127.0.0.1", server.raw_port).release();  // TCP_NODELAY set
  }
  ~Paths() {
    ::close(raw_);
    caf::anon_send_exit(front_, caf::exit_reason::user_shutdown);
  }

  // Through the data lane (lane shard -> lane -> socket -> lane server -> shard), as a
  // micro-batch reaches a remote shard; or straight to the remote actor through CAF's BASP.
  // msg is sent as it is and should be unshared: a shared message's payload is copied on
  // the way (as a micro-batch's request is not).
  double actor_once(bool lane, caf::message msg, size_t expect_back) {
    const auto t0 = Clock::now();
    size_t back = 0;
    self_->request(lane ? lane_ : basp_, std::chrono::seconds(120), std::move(msg))
        .receive([&](attn_reply& r) { back = r.o.size(); }, [&](caf::error& e) { fail(lane, e); });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (back != expect_back) throw Error("actor path: the reply has the wrong size");
    return s;
  }

  // Seconds for all of msgs through one actor path with up to `window` of them in flight, each
  // sent as soon as an earlier one is answered (the two-stage pipeline keeps two mini-batches,
  // so up to two requests per shard, in flight).
  double actor_stream(bool lane, std::vector<caf::message>& msgs, size_t window) {
    const caf::actor& to = lane ? lane_ : basp_;
    using Handle = decltype(self_->request(to, std::chrono::seconds(120), std::move(msgs[0])));
    std::deque<Handle> inflight;
    const auto wait_oldest = [&] {
      inflight.front().receive([](attn_reply&) {}, [&](caf::error& e) { fail(lane, e); });
      inflight.pop_front();
    };
    const auto t0 = Clock::now();
    for (auto& m : msgs) {
      if (inflight.size() == window) wait_oldest();
      inflight.push_back(self_->request(to, std::chrono::seconds(120), std::move(m)));
    }
    while (!inflight.empty()) wait_oldest();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // The same over the plain socket: each payload answered by one byte.
  double tcp_stream(const std::vector<std::vector<char>>& payloads, size_t window) {
    const auto t0 = Clock::now();
    size_t inflight = 0;
    char ack = 0;
    for (const auto& payload : payloads) {
      const RawHeader h{payload.size(), static_cast<uint64_t>(kAck)};
      if (inflight == window) {
        recv_answer(&ack, 1);
        --inflight;
      }
      send_all(raw_, reinterpret_cast<const char*>(&h), sizeof h);
      send_all(raw_, payload.data(), payload.size());
      ++inflight;
    }
    for (; inflight > 0; --inflight) recv_answer(&ack, 1);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  double tcp_once(const std::vector<char>& payload, int32_t mode, std::vector<char>& back) {
    const auto t0 = Clock::now();
    RawHeader h{payload.size(), static_cast<uint64_t>(mode)};
    send_all(raw_, reinterpret_cast<const char*>(&h), sizeof h);
    send_all(raw_, payload.data(), payload.size());
    const size_t n = mode == kEcho ? payload.size() : 1;
    if (back.size() < n) back.resize(n);
    recv_answer(back.data(), n);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  [[noreturn]] void fail(bool lane, const caf::error& e) {
    throw Error(std::string(lane ? "data lane" : "BASP") + " path: " + sys_.render(e));
  }
  void recv_answer(char* p, size_t n) {
    if (!recv_all(raw_, p, n)) throw Error("TCP path: the server closed the connection");
  }

  caf::actor_system& sys_;
  caf::scoped_actor self_;
  LaneAcceptor acceptor_;
  shard_actor front_;
  caf::actor lane_, basp_;
  int raw_ = -1;
};

caf::message request_of(const std::vector<char>& payload, int32_t mode) {
  attn_request r;
  r.layer = mode;
  r.q = payload;
  return caf::make_message(std::move(r));
}

// a / b, or 0 where a path was left out.
double per(double a, double b) { return a > 0 && b > 0 ? a / b : 0; }

struct Timings {
  std::vector<double> lane, basp, tcp;
};

// Alternates the paths rep by rep, so that all see the same machine load. Each actor transfer
// gets a message of its own, built before its timing starts, as a micro-batch builds each
// request from the S-part's output.
Timings measure(Paths& paths, const Options& o, const std::vector<char>& payload, int32_t mode, int reps) {
  const size_t expect = mode == kEcho ? payload.size() : 0;
  std::vector<char> back;
  Timings t;
  for (int i = -1; i < reps; ++i) {  // i = -1: warm-up (connections, buffers), not kept
    if (o.lane) t.lane.push_back(paths.actor_once(true, request_of(payload, mode), expect));
    if (o.basp) t.basp.push_back(paths.actor_once(false, request_of(payload, mode), expect));
    if (o.tcp) t.tcp.push_back(paths.tcp_once(payload, mode, back));
    if (i < 0) t = Timings{};
  }
  return t;
}

struct Throughput {
  double lane = 0, basp = 0, tcp = 0;                 // MiB/s
  double lane_cpu = 0, basp_cpu = 0, tcp_cpu = 0;     // µs of CPU per transfer, both processes
};

// CPU time of both processes, so that a path's cost shows even where two cores bound its speed.
class CpuClock {
 public:
  explicit CpuClock(pid_t server) {
    if (::clock_getcpuclockid(server, &server_) != 0) throw Error("cannot read the server process's CPU clock");
  }
  double seconds() const { return read(CLOCK_PROCESS_CPUTIME_ID) + read(server_); }

 private:
  static double read(clockid_t c) {
    timespec t{};
    ::clock_gettime(c, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  clockid_t server_{};
};

// Median over three rounds of the throughput of each path with `window` transfers in flight. Each
// transfer sends a buffer of its own, as each layer's request does, built before the round's
// timing starts: the actor paths' messages, and as many copies of the payload for TCP.
Throughput measure_stream(Paths& paths, const Options& o, const CpuClock& cpu, const std::vector<char>& payload,
                          int reps) {
  const double mib = static_cast<double>(payload.size()) / kMiB * reps;
  const auto messages = [&] {
    std::vector<caf::message> m;
    for (int i = 0; i < reps; ++i) m.push_back(request_of(payload, kAck));
    return m;
  };
  const size_t w = static_cast<size_t>(o.window);
  std::vector<double> lane, basp, tcp;
  double cpu_s[3] = {};  // lane, BASP, TCP over all rounds
  const auto timed = [&](int path, const auto& run) {
    const double c0 = cpu.seconds();
    const double seconds = run();
    cpu_s[path] += cpu.seconds() - c0;
    return mib / seconds;
  };
  constexpr int kRounds = 3;
  for (int round = 0; round < kRounds; ++round) {
    if (o.lane) {
      auto m = messages();
      lane.push_back(timed(0, [&] { return paths.actor_stream(true, m, w); }));
    }
    if (o.basp) {
      auto m = messages();
      basp.push_back(timed(1, [&] { return paths.actor_stream(false, m, w); }));
    }
    if (o.tcp) {
      const std::vector<std::vector<char>> copies(static_cast<size_t>(reps), payload);
      tcp.push_back(timed(2, [&] { return paths.tcp_stream(copies, w); }));
    }
  }
  const double per = 1e6 / (kRounds * reps);
  return {median(lane), median(basp), median(tcp), cpu_s[0] * per, cpu_s[1] * per, cpu_s[2] * per};
}

int run(const Options& o) {
  Server server = start_server(o);  // before any thread of this process exists
  int rc = 0;
  try {
    caf::actor_system_config cfg;
    configure(cfg, o);
    caf::actor_system sys{cfg};
    {
      Paths paths(sys, server);
      const CpuClock cpu(server.pid);
      if (!o.json)
        std::printf("loopback, transfer = payload + ack; throughput with %d in flight, 1-by-1 from the\n"
                    "median single transfer; actor = the data lane a micro-batch uses for a remote\n"
                    "shard, BASP = CAF's own; echo columns in ms; cpu = µs of CPU per streamed\n"
                    "transfer, both processes\n"
                    "%6s %5s %11s %10s %10s %6s %6s %8s %8s %7s %8s %8s %8s %6s %6s %6s\n",
                    o.window, "MiB", "reps", "actor MiB/s", "BASP MiB/s", "TCP MiB/s", "ratio", "BASP r.",
                    "1-by-1 a", "1-by-1 t", "1b1 r.", "a echo", "B echo", "T echo", "a cpu", "B cpu", "T cpu");
      for (int mb : o.sizes_mb) {
        const int reps = o.reps > 0 ? o.reps : std::max(5, std::min(100, 512 / mb));
        std::vector<char> payload(size_t(mb) * kMiB);
        for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131);
        const Timings one = measure(paths, o, payload, kAck, reps);
        const Timings echo = measure(paths, o, payload, kEcho, std::max(3, reps / 2));
        const Throughput tp = measure_stream(paths, o, cpu, payload, reps);
        const double lane = per(mb, median(one.lane)), basp = per(mb, median(one.basp)), tcp = per(mb, median(one.tcp));
        const double lane_echo_ms = median(echo.lane) * 1e3, basp_echo_ms = median(echo.basp) * 1e3,
                     tcp_echo_ms = median(echo.tcp) * 1e3;
        if (o.json) {
          JsonLine j;
          j.add("bench", std::string("transport"))
              .add("size_mib", int64_t(mb))
              .add("reps", int64_t(reps))
              .add("window", int64_t(o.window))
              .add("actor_mib_s", tp.lane)
              .add("basp_mib_s", tp.basp)
              .add("tcp_mib_s", tp.tcp)
              .add("ratio", per(tp.lane, tp.tcp))
              .add("basp_ratio", per(tp.basp, tp.tcp))
              .add("actor_cpu_us", tp.lane_cpu)
              .add("basp_cpu_us", tp.basp_cpu)
              .add("tcp_cpu_us", tp.tcp_cpu)
              .add("one_actor_mib_s", lane)
              .add("one_basp_mib_s", basp)
              .add("one_tcp_mib_s", tcp)
              .add("one_ratio", per(lane, tcp))
              .add("actor_echo_ms", lane_echo_ms)
              .add("basp_echo_ms", basp_echo_ms)
              .add("tcp_echo_ms", tcp_echo_ms);
          std::cout << j.str() << std::endl;
        } else {
          std::printf("%6d %5d %11.1f %10.1f %10.1f %6.2f %6.2f %8.1f %8.1f %7.2f %8.2f %8.2f %8.2f %6.0f %6.0f %6.0f\n",
                      mb, reps, tp.lane, tp.basp, tp.tcp, per(tp.lane, tp.tcp), per(tp.basp, tp.tcp), lane, tcp,
                      per(lane, tcp), lane_echo_ms, basp_echo_ms, tcp_echo_ms, tp.lane_cpu, tp.basp_cpu, tp.tcp_cpu);
          std::fflush(stdout);
        }
      }
      std::vector<char> small(size_t(o.small_kb) * 1024, 'x');
      const Timings t = measure(paths, o, small, kAck, o.small_reps);
      const double lane_us = median(t.lane) * 1e6, basp_us = median(t.basp) * 1e6, tcp_us = median(t.tcp) * 1e6;
      if (o.json) {
        JsonLine j;
        j.add("bench", std::string("transport_small"))
            .add("size_kib", int64_t(o.small_kb))
            .add("reps", int64_t(o.small_reps))
            .add("actor_rtt_us", lane_us)
            .add("basp_rtt_us", basp_us)
            .add("tcp_rtt_us", tcp_us)
            .add("overhead_us", lane_us - tcp_us);
        std::cout << j.str() << std::endl;
      } else {
        std::printf("%d KiB round trip (median of %d): actor %.1f us, BASP %.1f us, TCP %.1f us; "
                    "per-layer overhead of the actor path %.1f us\n",
                    o.small_kb, o.small_reps, lane_us, basp_us, tcp_us, lane_us - tcp_us);
      }
    }
  } catch (...) {
    stop_server(server);
    throw;
  }
  stop_server(server);
  return rc;
}

}  // namespace

int bench_transport_main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) return 0;
  if (o.serve) return serve_main(o);
  return run(o);
}

}  // namespace fd
