#include "examples/common/trace_options.h"

#include <boost/program_options.hpp>
#include <cstdlib>
#include <iostream>

#include "examples/common/node_options.h"
#include "runtime/error.h"

namespace po = boost::program_options;

namespace fd {

bool parse_trace_args(int argc, const char* const* argv, TraceArgs& a) {
  po::options_description desc("fastdecode-trace options");
  desc.add_options()
      ("help,h", "show this help")
      ("connect", po::value(&a.connect), "HOST:PORT of a gpu node (fastdecode-node --role gpu)")
      ("token", po::value(&a.token), "cluster secret (default: $FASTDECODE_TOKEN)")
      ("record", po::value(&a.record),
       "write the events to this Chrome Trace Event JSON file (Perfetto, chrome://tracing)")
      ("duration", po::value(&a.duration_s)->default_value(0),
       "seconds to trace; 0 = until Ctrl-C")
      ("refresh", po::value(&a.refresh_s)->default_value(1), "seconds between live views")
      ("quiet,q", po::bool_switch(&a.quiet), "no live view");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(std::string(e.what()) + " (see --help)");
  }
  if (vm.count("help")) {
    std::cout << "usage: fastdecode-trace --connect HOST:PORT [--token SECRET] [--record FILE.json]"
                 " [--duration SECONDS]\n"
              << desc;
    return false;
  }
  if (a.connect.empty()) throw Error("--connect HOST:PORT is required (see --help)");
  parse_host_port(a.connect, "--connect");
  if (!(a.duration_s >= 0)) throw Error("--duration must be >= 0");
  if (!(a.refresh_s >= 0.05)) throw Error("--refresh must be at least 0.05 s");
  if (a.token.empty())
    if (const char* env = std::getenv("FASTDECODE_TOKEN")) a.token = env;
  return true;
}

}  // namespace fd
