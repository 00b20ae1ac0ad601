#include "examples/common/repl_options.h"

#include <boost/program_options.hpp>
#include <cstdlib>
#include <iostream>

#include "examples/common/node_options.h"
#include "runtime/error.h"

namespace po = boost::program_options;

namespace fd {

bool parse_repl_args(int argc, const char* const* argv, ReplArgs& a) {
  SamplingParams& sp = a.settings.sampling;
  po::options_description desc("fastdecode-repl options");
  desc.add_options()
      ("help,h", "show this help")
      ("connect", po::value(&a.connect), "HOST:PORT of a gpu node (fastdecode-node --role gpu)")
      ("token", po::value(&a.token), "cluster secret (default: $FASTDECODE_TOKEN)")
      ("n-predict,n", po::value(&a.settings.max_new)->default_value(128),
       "tokens to generate at most per answer (/max)")
      ("temperature", po::value(&sp.temperature)->default_value(0.8f), "0 = greedy (/temp)")
      ("top-k", po::value(&sp.top_k)->default_value(40), "0 = no limit (/topk)")
      ("top-p", po::value(&sp.top_p)->default_value(0.95f), "1 = no limit (/topp)")
      ("seed", po::value(&sp.seed)->default_value(42), "sampling seed (/seed)")
      ("silence", po::value(&a.silence_s)->default_value(120),
       "seconds a generation may go without a token before it is given up");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(std::string(e.what()) + " (see --help)");
  }
  if (vm.count("help")) {
    std::cout << "usage: fastdecode-repl --connect HOST:PORT [--token SECRET] [options]\n"
              << desc;
    return false;
  }
  if (a.connect.empty()) throw Error("--connect HOST:PORT is required (see --help)");
  parse_host_port(a.connect, "--connect");
  if (a.settings.max_new < 1) throw Error("-n must be at least 1");
  if (a.settings.sampling.top_k < 0) throw Error("--top-k must be >= 0");
  validate(a.settings.sampling);
  if (!(a.silence_s > 0)) throw Error("--silence must be positive");
  if (a.token.empty())
    if (const char* env = std::getenv("FASTDECODE_TOKEN")) a.token = env;
  return true;
}

}  // namespace fd
