#include "runtime/host_memory.h"

#include <cstdio>
#include <fstream>

namespace fd {

size_t available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (f >> key >> kib) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (v == static_cast<double>(static_cast<size_t>(v)))
    std::snprintf(buf, sizeof buf, "%zu %s", static_cast<size_t>(v), units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace fd
