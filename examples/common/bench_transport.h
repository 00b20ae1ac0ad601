// `fastdecode-bench transport`: payload throughput between two processes over loopback through
// the actor path (CAF middleman, typed request/reply of attn_request) against a plain TCP socket
// in the same run, and the round trip of a small payload (the per-layer overhead of a shard hop).
#pragma once

namespace fd {

// argv[0] is the mode name ("transport"). Returns the process exit code.
int bench_transport_main(int argc, char** argv);

}  // namespace fd
