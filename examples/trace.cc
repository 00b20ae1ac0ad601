// fastdecode-trace: live view of a gpu node's actors, and a Chrome Trace Event recording.
#include <iostream>

#include "examples/common/trace_console.h"
#include "examples/common/trace_options.h"

int main(int argc, char** argv) {
  try {
    fd::TraceArgs args;
    if (!fd::parse_trace_args(argc, argv, args)) return 0;
    return fd::run_trace(args);
  } catch (const std::exception& e) {
    std::cerr << "fastdecode-trace: error: " << e.what() << "\n";
    return 2;
  }
}
