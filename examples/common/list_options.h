// Values of command-line options: comma-separated lists ("1,16,64") and bounded counts.
#pragma once
#include <string>
#include <vector>

#include "kernels/attention.h"

namespace fd {

// The items of text split at commas; throws fd::Error naming --flag when there is none.
std::vector<std::string> split_list(const std::string& text, const char* flag);

// Integers in [lo, hi]; throws fd::Error naming --flag and the text for anything else.
std::vector<int> parse_int_list(const std::string& text, const char* flag, int lo = 1,
                                int hi = 1 << 30);

// KV formats named f16, int8 or int4 (or q8, q4); throws fd::Error naming --kv-dtype and the text otherwise.
std::vector<kernels::KvDtype> parse_kv_dtype_list(const std::string& text);

// Throws fd::Error("--flag must be lo to hi, not value") outside [lo, hi]. Thread and shard counts
// are bounded so that a typo cannot start thousands of threads.
void check_count(int value, const char* flag, int lo, int hi);

constexpr int kMaxShards = 256;      // R-worker shards per node: each is a thread
constexpr int kMaxCafThreads = 64;   // actor scheduler threads

// The cores this machine reports (at least 1).
int machine_cores();

}  // namespace fd
