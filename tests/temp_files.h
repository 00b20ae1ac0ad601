// A temporary directory removed with everything in it, and whole-file byte I/O, for tests that
// write files and then corrupt them.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace testing_files {

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("fd-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()) +
             std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

using Bytes = std::vector<uint8_t>;

inline Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Offset of the first occurrence of s in b.
inline size_t find_bytes(const Bytes& b, const std::string& s) {
  auto it = std::search(b.begin(), b.end(), s.begin(), s.end());
  REQUIRE(it != b.end());
  return static_cast<size_t>(it - b.begin());
}

}  // namespace testing_files
