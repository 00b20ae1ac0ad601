// `fastdecode-bench prefill`: a prompt's prefill attention on an R-worker's threads, alone and
// beside decoding sequences in the same call, against the same call on one thread.
#pragma once

namespace fd {

// argv[0] is the mode name ("prefill"). Returns the process exit code.
int bench_prefill_main(int argc, char** argv);

}  // namespace fd
