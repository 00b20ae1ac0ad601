// Command line of fastdecode-repl.
#pragma once
#include <string>

#include "examples/common/repl_commands.h"

namespace fd {

struct ReplArgs {
  std::string connect;      // HOST:PORT of a gpu node
  std::string token;        // cluster secret (--token or FASTDECODE_TOKEN)
  ReplSettings settings;    // the first prompt's; slash commands change them
  double silence_s = 120;   // a generation that hears nothing this long is given up
};

// Throws fd::Error with one line naming the bad flag or value. Returns false after --help.
bool parse_repl_args(int argc, const char* const* argv, ReplArgs& out);

}  // namespace fd
