// fastdecode-node: one node of a FastDecode deployment.
#include <iostream>

#include "examples/common/node_options.h"
#include "examples/common/run_prompts.h"

int main(int argc, char** argv) {
  try {
    fd::NodeArgs args;
    if (!fd::parse_node_args(argc, argv, args)) return 0;
    if (args.role != "all")
      throw fd::Error("--role " + args.role + " is not available yet in this build; use --role all");
    return fd::run_prompts_all(args);
  } catch (const std::exception& e) {
    std::cerr << "fastdecode-node: error: " << e.what() << "\n";
    return 2;
  }
}
