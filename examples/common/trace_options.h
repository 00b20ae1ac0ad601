// Command line of fastdecode-trace.
#pragma once
#include <string>

namespace fd {

struct TraceArgs {
  std::string connect;    // HOST:PORT of a gpu node
  std::string token;      // cluster secret (--token or FASTDECODE_TOKEN)
  std::string record;     // Chrome Trace Event JSON file; empty: none
  double duration_s = 0;  // stop after this long; 0: until Ctrl-C
  double refresh_s = 1;   // live view period
  bool quiet = false;     // no live view (recording only)
};

// Throws fd::Error with one line naming the bad flag or value. Returns false after --help.
bool parse_trace_args(int argc, const char* const* argv, TraceArgs& out);

}  // namespace fd
