// The last-level cache a benchmark must outgrow to read from memory.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace fd {

// Bytes of last-level cache that the given CPUs can fill: the highest-level data or unified
// cache of each, each instance (CPUs listed in one shared_cpu_list) counted once, as cpu_dir
// describes them (Linux sysfs: cpu_dir/cpuN/cache/indexI/{level,type,size,shared_cpu_list}).
// 0 when cpu_dir says nothing usable.
size_t last_level_cache_bytes(const std::string& cpu_dir, const std::vector<int>& cpus);

// The same for the CPUs this process may run on, from /sys/devices/system/cpu, then from
// sysconf(_SC_LEVEL3_CACHE_SIZE) when sysfs says nothing; 0 when neither does. sysfs first:
// glibc takes sysconf's figure from CPUID, which a virtual machine may pass through from its
// host (256 MiB on an AMD EPYC guest whose sysfs, like its lscpu, says 32 MiB).
size_t last_level_cache_bytes();

}  // namespace fd
