#include "examples/common/list_options.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "kernels/kv_format.h"
#include "runtime/error.h"

namespace fd {

std::vector<std::string> split_list(const std::string& text, const char* flag) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  if (out.empty()) throw Error(std::string("--") + flag + " needs at least one value.");
  return out;
}

std::vector<kernels::KvDtype> parse_kv_dtype_list(const std::string& text) {
  std::vector<kernels::KvDtype> out;
  for (const std::string& item : split_list(text, "kv-dtype")) {
    kernels::KvDtype d;
    if (!kernels::parse_kv_dtype(item, &d))
      throw Error("--kv-dtype must list f16, int8 (q8) or int4 (q4), not '" + item + "'.");
    out.push_back(d);
  }
  return out;
}

std::vector<int> parse_int_list(const std::string& text, const char* flag, int lo, int hi) {
  std::vector<int> out;
  for (const std::string& item : split_list(text, flag)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < lo || v > hi)
      throw Error(std::string("--") + flag + " must be a comma-separated list of integers from " +
                  std::to_string(lo) + " to " + std::to_string(hi) + ", not '" + text + "'.");
    out.push_back(v);
  }
  return out;
}

void check_count(int value, const char* flag, int lo, int hi) {
  if (value < lo || value > hi)
    throw Error(std::string("--") + flag + " must be " + std::to_string(lo) + " to " + std::to_string(hi) +
                ", not " + std::to_string(value));
}

int machine_cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

}  // namespace fd
