#include "examples/common/machine_caches.h"

#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "examples/common/list_options.h"

namespace fd {
namespace {

std::string read_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

// sysfs sizes: "32768K", "1M", or plain bytes; 0 when unreadable.
size_t parse_cache_size(const std::string& text) {
  size_t i = 0, n = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) n = n * 10 + size_t(text[i] - '0');
  if (i == 0) return 0;
  const std::string unit = text.substr(i);
  if (unit.empty()) return n;
  if (unit == "K") return n << 10;
  if (unit == "M") return n << 20;
  if (unit == "G") return n << 30;
  return 0;
}

// The CPUs this process may run on; the first machine_cores() when the mask cannot be read.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  } else {
    for (int c = 0; c < machine_cores(); ++c) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace

size_t last_level_cache_bytes(const std::string& cpu_dir, const std::vector<int>& cpus) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int top = 0;
  std::map<std::string, size_t> instances;  // shared_cpu_list -> size, at level `top`
  for (int cpu : cpus) {
    const fs::path cache = fs::path(cpu_dir) / ("cpu" + std::to_string(cpu)) / "cache";
    for (const auto& e : fs::directory_iterator(cache, ec)) {
      const std::string type = read_line(e.path() / "type");
      if (type != "Data" && type != "Unified") continue;
      const std::string level_text = read_line(e.path() / "level");
      const int level = level_text.empty() ? 0 : std::atoi(level_text.c_str());
      const size_t size = parse_cache_size(read_line(e.path() / "size"));
      if (level <= 0 || size == 0 || level < top) continue;
      if (level > top) {
        top = level;
        instances.clear();
      }
      std::string shared = read_line(e.path() / "shared_cpu_list");
      if (shared.empty()) shared = "cpu" + std::to_string(cpu);
      instances[shared] = size;
    }
  }
  size_t total = 0;
  for (const auto& [shared, size] : instances) total += size;
  return total;
}

size_t last_level_cache_bytes() {
  if (const size_t bytes = last_level_cache_bytes("/sys/devices/system/cpu", allowed_cpus()); bytes > 0) return bytes;
  const long llc = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  return llc > 0 ? static_cast<size_t>(llc) : 0;
}

}  // namespace fd
