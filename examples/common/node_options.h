// Command line of fastdecode-node.
#pragma once
#include <cstdint>
#include <exception>
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
  int threads = 2;       // CAF scheduler threads
  int gemm_threads = 0;  // BLAS threads per S-part call; 0: cores / pipeline
  bool json = false;
  // Network roles.
  std::string listen = "127.0.0.1:4242";  // --role gpu
  int lane_port = 0;                      // --role gpu: data lane port on the listen host; 0: any
  std::string join;                       // --role cpu: the gpu node
  std::string token;                      // cluster secret (--token or FASTDECODE_TOKEN)
  int min_shards = 1;                     // --role gpu with prompts: wait for this many
  double min_shards_wait_s = 60;
  std::string node_name;                  // --role cpu: name in logs
  int group = 0;                          // --role cpu: R-group served (model parallelism)
  bool kv_memory_given = false;           // --kv-memory was set; else local.kv_memory is a cap
};

struct HostPort {
  std::string host;
  uint16_t port = 0;
};
HostPort parse_host_port(const std::string& text, const char* flag);
bool is_loopback(const std::string& host);

// Throws fd::Error with one line naming the bad flag or value. Returns false after --help.
bool parse_node_args(int argc, const char* const* argv, NodeArgs& out);

// "8GiB", "512MiB", "1G", "4096" (bytes) -> bytes.
size_t parse_size(const std::string& text);

// The one line a node prints for an error that ends it; returns the exit code, 2.
int report_node_error(const std::exception& e);

}  // namespace fd
