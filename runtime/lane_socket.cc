#include "runtime/lane_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/tensor_memory.h"

namespace fd::lane {
namespace {

constexpr uint32_t kMagic = 0x4C444446;  // "FDDL" in memory order

// On the wire, little-endian as every supported host is.
struct Header {
  uint32_t magic;
  uint32_t kind;
  uint64_t ticket;
  uint32_t target;
  uint32_t meta_bytes;
  uint64_t payload_bytes[kPayloads];
};
static_assert(sizeof(Header) == 48, "the header is 48 bytes on the wire");

std::string sys_error(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

bool known_kind(uint32_t k) { return k >= uint32_t(FrameKind::hello) && k <= uint32_t(FrameKind::failure); }

// Room for n bytes in b, whose old contents do not matter; large buffers get huge pages.
void reserve_for_read(Buffer& b, size_t n) {
  b.clear();
  if (n >= 2 * kHugePage)
    reserve_huge(b, n);
  else
    b.reserve(n);
}

// Reads exactly n bytes. False when the peer closed before the first byte and `eof_ok`.
bool read_exact(int fd, char* p, size_t n, bool eof_ok) {
  const size_t want = n;
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      if (eof_ok && n == want) return false;
      throw Error("data lane: the peer closed the connection in the middle of a frame");
    }
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        throw Error("data lane: the peer sent nothing within the receive timeout");
      throw Error(sys_error("data lane: receive failed"));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Reads n bytes into b. The vector grows a step at a time as the bytes arrive: sizing it at
// once would zero all of it first while the sender waits (5 ms for 64 MiB).
void read_payload(int fd, Buffer& b, size_t n) {
  constexpr size_t kStep = size_t(256) << 10;
  reserve_for_read(b, n);
  while (b.size() < n) {
    const size_t at = b.size(), step = std::min(kStep, n - at);
    b.resize(at + step);
    read_exact(fd, b.data() + at, step, false);
  }
}

// Every address of host:port, in getaddrinfo's order of preference.
std::vector<std::pair<sockaddr_storage, socklen_t>> resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0 || !res)
    throw Error("data lane: cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::vector<std::pair<sockaddr_storage, socklen_t>> out;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    sockaddr_storage addr{};
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    out.emplace_back(addr, a->ai_addrlen);
  }
  ::freeaddrinfo(res);
  return out;
}

void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

timeval to_timeval(std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  return tv;
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.release();
  }
  return *this;
}

int Socket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Socket listen_tcp(const std::string& host, uint16_t& port) {
  auto [addr, len] = resolve(host, port, true).front();
  Socket s(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd() < 0) throw Error(sys_error("data lane: cannot create a socket"));
  int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(s.fd(), 16) != 0)
    throw Error(sys_error(("data lane: cannot listen on " + host + ":" + std::to_string(port)).c_str()));
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  if (::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&bound), &blen) != 0)
    throw Error(sys_error("data lane: getsockname failed"));
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return s;
}

Socket accept_tcp(const Socket& listener, std::chrono::milliseconds timeout) {
  pollfd p{listener.fd(), POLLIN, 0};
  const int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (rc <= 0 || (p.revents & POLLIN) == 0) return Socket();
  Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
  if (s.fd() >= 0) no_delay(s.fd());
  return s;
}

// Tries each address in turn: a name such as localhost may give ::1 first while the peer
// listens on 127.0.0.1 only.
Socket connect_tcp(const std::string& host, uint16_t port) {
  std::string why;
  for (auto& [addr, len] : resolve(host, port, false)) {
    Socket s(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.fd() < 0) {
      why = sys_error("data lane: cannot create a socket");
      continue;
    }
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
      no_delay(s.fd());
      return s;
    }
    why = sys_error(("data lane: cannot connect to " + host + ":" + std::to_string(port)).c_str());
  }
  throw Error(why);
}

void set_io_timeouts(const Socket& s, std::chrono::milliseconds send, std::chrono::milliseconds recv) {
  const timeval st = to_timeval(send), rt = to_timeval(recv);
  ::setsockopt(s.fd(), SOL_SOCKET, SO_SNDTIMEO, &st, sizeof st);
  ::setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt);
}

void write_frame(const Socket& s, FrameKind kind, uint64_t ticket, uint32_t target, const Buffer& meta,
                 const Buffer* const payload[kPayloads]) {
  Header h{kMagic, static_cast<uint32_t>(kind), ticket, target, static_cast<uint32_t>(meta.size()), {}};
  if (meta.size() > kMaxMeta) throw Error("data lane: frame metadata too large");
  iovec iov[2 + kPayloads];
  int n = 0;
  iov[n++] = {&h, sizeof h};
  if (!meta.empty()) iov[n++] = {const_cast<char*>(meta.data()), meta.size()};
  for (size_t i = 0; i < kPayloads; ++i) {
    const size_t bytes = payload && payload[i] ? payload[i]->size() : 0;
    if (bytes > kMaxPayload) throw Error("data lane: tensor payload too large");
    h.payload_bytes[i] = bytes;
    if (bytes > 0) iov[n++] = {const_cast<char*>(payload[i]->data()), bytes};
  }
  iovec* at = iov;
  while (n > 0) {
    msghdr msg{};
    msg.msg_iov = at;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = ::sendmsg(s.fd(), &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        throw Error("data lane: the peer took nothing within the send timeout");
      throw Error(sys_error("data lane: send failed"));
    }
    size_t done = static_cast<size_t>(w);
    while (n > 0 && done >= at->iov_len) {
      done -= at->iov_len;
      ++at;
      --n;
    }
    if (n > 0) {
      at->iov_base = static_cast<char*>(at->iov_base) + done;
      at->iov_len -= done;
    }
  }
}

size_t send_room(const Socket& s) {
  int sndbuf = 0, queued = 0;
  socklen_t len = sizeof sndbuf;
  if (::getsockopt(s.fd(), SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) != 0 || ::ioctl(s.fd(), SIOCOUTQ, &queued) != 0)
    return 0;
  return sndbuf > queued ? static_cast<size_t>(sndbuf - queued) / 2 : 0;
}

bool read_frame(const Socket& s, Frame& out, size_t max_meta, uint64_t max_payload) {
  Header h{};
  if (!read_exact(s.fd(), reinterpret_cast<char*>(&h), sizeof h, true)) return false;
  if (h.magic != kMagic) throw Error("data lane: the peer does not speak the lane protocol");
  if (!known_kind(h.kind)) throw Error("data lane: unknown frame kind " + std::to_string(h.kind));
  if (h.meta_bytes > std::min(max_meta, kMaxMeta)) throw Error("data lane: frame metadata too large");
  for (uint64_t b : h.payload_bytes)
    if (b > std::min(max_payload, kMaxPayload)) throw Error("data lane: tensor payload too large");
  out.kind = static_cast<FrameKind>(h.kind);
  out.ticket = h.ticket;
  out.target = h.target;
  out.meta.resize(h.meta_bytes);
  if (h.meta_bytes > 0) read_exact(s.fd(), out.meta.data(), h.meta_bytes, false);
  for (size_t i = 0; i < kPayloads; ++i) read_payload(s.fd(), out.payload[i], static_cast<size_t>(h.payload_bytes[i]));
  return true;
}

}  // namespace fd::lane
