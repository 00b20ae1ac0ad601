// The data lane's wire: length-prefixed frames over a TCP socket of its own. A frame is a fixed
// header, a small metadata block and up to three tensor payloads, written with one writev from
// the buffers where they already are and read straight into buffers of their final size, so a
// tensor is copied only by the kernel (CAF's BASP copies it into and out of its own buffers).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fd::lane {

using Buffer = std::vector<char>;

enum class FrameKind : uint32_t {
  hello = 1,    // cpu node -> gpu node: who it is (metadata: the lane hello)
  welcome = 2,  // gpu node -> cpu node: accepted
  refused = 3,  // gpu node -> cpu node: why not (metadata: the text); the connection closes
  request = 4,  // gpu node -> cpu node: attention request for shard `target`
  reply = 5,    // cpu node -> gpu node: its answer
  failure = 6,  // cpu node -> gpu node: the shard's error instead
};

constexpr size_t kPayloads = 3;
constexpr size_t kMaxMeta = size_t(1) << 20;      // bytes of metadata a frame may carry
constexpr uint64_t kMaxPayload = uint64_t(1) << 32;  // bytes per payload

struct Frame {
  FrameKind kind = FrameKind::hello;
  uint64_t ticket = 0;  // pairs a request with its reply
  uint32_t target = 0;  // the shard a request is for, by its index on the cpu node
  Buffer meta;
  Buffer payload[kPayloads];
};

// An owned socket descriptor; closing is idempotent.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }
  int fd() const { return fd_; }
  int release();
  void close();
  // Ends both directions now: a thread blocked reading it returns. The descriptor stays open.
  void shutdown();

 private:
  int fd_ = -1;
};

// Listens on host:port (port 0: any free port, stored back into port). Throws fd::Error.
Socket listen_tcp(const std::string& host, uint16_t& port);
// Waits up to `timeout` for a connection; an invalid Socket when none came or the listener was
// shut down.
Socket accept_tcp(const Socket& listener, std::chrono::milliseconds timeout);
// Connects to host:port (a name or address). Throws fd::Error naming the peer.
Socket connect_tcp(const std::string& host, uint16_t port);
// Blocking reads and writes give up after these times (0: never), so a peer that stops reading
// or writing (a stopped process) cannot hold a thread for ever.
void set_io_timeouts(const Socket& s, std::chrono::milliseconds send, std::chrono::milliseconds recv);

// About how many bytes a write could queue on s now without waiting for the peer: half the free
// space of its send buffer (the kernel counts its own overhead against the buffer). 0 when unknown.
size_t send_room(const Socket& s);

// Writes one frame whole. Throws fd::Error when the connection fails or times out.
void write_frame(const Socket& s, FrameKind kind, uint64_t ticket, uint32_t target, const Buffer& meta,
                 const Buffer* const payload[kPayloads]);
// Reads one frame whole. False when the peer closed the connection between frames; throws
// fd::Error for a broken or timed-out connection and for a malformed frame (wrong magic, unknown
// kind, sizes beyond the limits above or beyond max_meta and max_payload, which a peer not yet
// trusted gets small: nothing is allocated for a frame before its sizes are checked).
bool read_frame(const Socket& s, Frame& out, size_t max_meta = kMaxMeta,
                uint64_t max_payload = kMaxPayload);

}  // namespace fd::lane
