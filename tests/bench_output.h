// Running a fastdecode-bench mode in the test process and reading its --json lines.
#pragma once
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace fd::test {

// Runs main_fn as `fastdecode-bench mode args...` and returns its stdout lines (exceptions pass
// through, with std::cout restored).
inline std::vector<std::string> run_bench_mode(int (*main_fn)(int, char**), const char* mode,
                                               std::vector<std::string> args) {
  args.insert(args.begin(), mode);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::ostringstream out;
  std::streambuf* old = std::cout.rdbuf(out.rdbuf());
  try {
    main_fn(static_cast<int>(argv.size()), argv.data());
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  std::vector<std::string> lines;
  std::istringstream in(out.str());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The number after "key": in a flat JSON line; NaN when the key is missing.
inline double json_field(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return std::nan("");
  return std::strtod(line.c_str() + at + key.size() + 3, nullptr);
}

// The string after "key": in a flat JSON line (no escapes); "" when the key or its string is missing.
inline std::string json_string(const std::string& line, const std::string& key) {
  const std::string head = "\"" + key + "\":\"";
  const auto at = line.find(head);
  if (at == std::string::npos) return "";
  const auto begin = at + head.size(), end = line.find('"', begin);
  return end == std::string::npos ? "" : line.substr(begin, end - begin);
}

}  // namespace fd::test
