// Command line of fastdecode-node.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "actors/system.h"
#include "runtime/sampler.h"

namespace fd {

struct NodeArgs {
  std::string role = "all";
  std::string model_path;  // empty: the built-in synthetic model
  std::vector<std::string> prompts;
  int n_predict = 32;
  SamplingParams sampling;
  LocalOptions local;
  int threads = 2;  // CAF scheduler threads
  bool json = false;
};

// Throws fd::Error with one line naming the bad flag or value. Returns false after --help.
bool parse_node_args(int argc, const char* const* argv, NodeArgs& out);

// "8GiB", "512MiB", "1G", "4096" (bytes) -> bytes.
size_t parse_size(const std::string& text);

}  // namespace fd
