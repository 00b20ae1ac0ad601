// fastdecode-bench: micro-benchmarks, one mode per subcommand.
#include <cstring>
#include <exception>
#include <iostream>

#include "examples/common/bench_attention.h"
#include "examples/common/bench_plan.h"
#include "examples/common/bench_prefill.h"
#include "examples/common/bench_schedule.h"
#include "examples/common/bench_sworker.h"
#include "examples/common/bench_transport.h"
#include "runtime/tensor_memory.h"

namespace {

void usage(std::ostream& os) {
  os << "usage: fastdecode-bench MODE [options]   (MODE --help lists a mode's options)\n"
        "modes:\n"
        "  attention   decode attention over a KV-cache vs. the machine's read bandwidth\n"
        "  plan        the performance model's tokens/s for a configuration, then a real run of it\n"
        "  prefill     a prompt's attention on all threads, alone and beside decoding sequences\n"
        "  schedule    large-batch, sls and load-control on one workload: per-step latency and load\n"
        "  sworker     the S-part of one layer, T(B), on the CUDA or CPU backend\n"
        "  transport   payloads between two processes: actor path vs. plain TCP on loopback\n";
}

}  // namespace

int main(int argc, char** argv) {
  fd::reuse_tensor_memory();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  try {
    if (!std::strcmp(argv[1], "attention")) return fd::bench_attention_main(argc - 1, argv + 1);
    if (!std::strcmp(argv[1], "plan")) return fd::bench_plan_main(argc - 1, argv + 1);
    if (!std::strcmp(argv[1], "prefill")) return fd::bench_prefill_main(argc - 1, argv + 1);
    if (!std::strcmp(argv[1], "schedule")) return fd::bench_schedule_main(argc - 1, argv + 1);
    if (!std::strcmp(argv[1], "sworker")) return fd::bench_sworker_main(argc - 1, argv + 1);
    if (!std::strcmp(argv[1], "transport")) return fd::bench_transport_main(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::cerr << "fastdecode-bench: error: " << e.what() << "\n";
    return 2;
  }
  std::cerr << "fastdecode-bench: unknown mode '" << argv[1] << "'\n";
  usage(std::cerr);
  return 2;
}
