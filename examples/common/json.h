// Minimal JSON output for --json lines: one flat object per line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fd {

// A JSON string literal; invalid UTF-8 bytes become U+FFFD so the line stays valid JSON.
std::string json_string(const std::string& s);

class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& value);
  JsonLine& add(const std::string& key, double value);
  JsonLine& add(const std::string& key, int64_t value);
  JsonLine& add(const std::string& key, const std::vector<int32_t>& values);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

}  // namespace fd
