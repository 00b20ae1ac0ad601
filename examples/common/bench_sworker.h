// `fastdecode-bench sworker`: the S-part of one layer (RMSNorm, QKV, RoPE, Wo, MLP) as a function
// of the batch B, T(B), at Llama-7B and 13B shapes, on the CUDA or the CPU backend.
#pragma once

namespace fd {

// argv[0] is the mode name ("sworker"). Returns the process exit code.
int bench_sworker_main(int argc, char** argv);

}  // namespace fd
