// fastdecode-node: one node of a FastDecode deployment.

#include "examples/common/net_roles.h"
#include "examples/common/node_options.h"
#include "examples/common/run_prompts.h"
#include "runtime/tensor_memory.h"

int main(int argc, char** argv) {
  fd::reuse_tensor_memory();
  try {
    fd::NodeArgs args;
    if (!fd::parse_node_args(argc, argv, args)) return 0;
    if (args.role == "gpu") return fd::run_gpu_role(args);
    if (args.role == "cpu") return fd::run_cpu_role(args);
    return fd::run_prompts_all(args);
  } catch (const std::exception& e) {
    return fd::report_node_error(e);
  }
}
