// last_level_cache_bytes over made-up sysfs trees: the highest level's instances, each counted
// once, for the CPUs asked about.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "examples/common/machine_caches.h"
#include "tests/temp_files.h"

namespace {

void write_cache(const testing_files::TempDir& dir, int cpu, int index, const std::string& level,
                 const std::string& type, const std::string& size, const std::string& shared) {
  const std::filesystem::path at =
      std::filesystem::path(dir.file("cpu" + std::to_string(cpu))) / "cache" / ("index" + std::to_string(index));
  std::filesystem::create_directories(at);
  std::ofstream(at / "level") << level << "\n";
  std::ofstream(at / "type") << type << "\n";
  std::ofstream(at / "size") << size << "\n";
  std::ofstream(at / "shared_cpu_list") << shared << "\n";
}

// A core's private caches: 32K data and instruction, 512K unified.
void write_private(const testing_files::TempDir& dir, int cpu) {
  const std::string me = std::to_string(cpu);
  write_cache(dir, cpu, 0, "1", "Data", "32K", me);
  write_cache(dir, cpu, 1, "1", "Instruction", "32K", me);
  write_cache(dir, cpu, 2, "2", "Unified", "512K", me);
}

}  // namespace

TEST_CASE("the last-level cache is the highest level's size, once per instance", "[bench]") {
  testing_files::TempDir dir("caches");
  const std::string root = dir.file("");
  for (int cpu = 0; cpu < 4; ++cpu) {
    write_private(dir, cpu);
    write_cache(dir, cpu, 3, "3", "Unified", "32768K", cpu < 2 ? "0-1" : "2-3");
  }
  CHECK(fd::last_level_cache_bytes(root, {0, 1}) == size_t(32) << 20);  // two CPUs, one L3
  CHECK(fd::last_level_cache_bytes(root, {0}) == size_t(32) << 20);
  CHECK(fd::last_level_cache_bytes(root, {0, 1, 2, 3}) == size_t(64) << 20);  // two L3s
  CHECK(fd::last_level_cache_bytes(root, {1, 2}) == size_t(64) << 20);
}

TEST_CASE("the last-level cache skips what sysfs cannot say", "[bench]") {
  testing_files::TempDir dir("caches-odd");
  const std::string root = dir.file("");
  write_private(dir, 0);
  // An instruction cache is not where KV is read into, and an unreadable size is no size.
  write_cache(dir, 0, 3, "3", "Instruction", "64M", "0");
  write_cache(dir, 0, 4, "4", "Unified", "lots", "0");
  CHECK(fd::last_level_cache_bytes(root, {0}) == size_t(512) << 10);  // the L2
  CHECK(fd::last_level_cache_bytes(root, {0, 7}) == size_t(512) << 10);  // a CPU without a cache directory adds nothing
  CHECK(fd::last_level_cache_bytes(root, {7}) == 0);
  CHECK(fd::last_level_cache_bytes(dir.file("missing"), {0}) == 0);
  write_cache(dir, 0, 5, "3", "Unified", "1048576", "0");  // plain bytes
  CHECK(fd::last_level_cache_bytes(root, {0}) == size_t(1) << 20);
}
