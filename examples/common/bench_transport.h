// `fastdecode-bench transport`: payload throughput between two processes over loopback through
// the actor path to a remote shard (typed request/reply of attn_request over the data lane), and
// through CAF's BASP, against a plain TCP socket in the same run, and the round trip of a small
// payload (the per-layer overhead of a shard hop).
#pragma once

namespace fd {

// argv[0] is the mode name ("transport"). Returns the process exit code.
int bench_transport_main(int argc, char** argv);

}  // namespace fd
