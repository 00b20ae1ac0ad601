// fastdecode-repl: an interactive prompt against a running gpu node; answers stream as generated.
#include <iostream>

#include "examples/common/client_connection.h"
#include "examples/common/repl_options.h"
#include "examples/common/repl_terminal.h"

int main(int argc, char** argv) {
  try {
    fd::ReplArgs args;
    if (!fd::parse_repl_args(argc, argv, args)) return 0;
    return fd::run_repl(args);
  } catch (const std::exception& e) {
    std::cerr << "fastdecode-repl: error: " << e.what() << "\n";
    return 2;
  }
}
