// `fastdecode-bench attention`: decode attention throughput over a paged KV-cache, against the
// machine's streaming read bandwidth measured in the same run with the same threads.
#pragma once

namespace fd {

// argv[0] is the mode name ("attention"). Returns the process exit code.
int bench_attention_main(int argc, char** argv);

}  // namespace fd
