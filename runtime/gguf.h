// Read-only GGUF v2/v3 file, memory-mapped. Every malformed input throws fd::Error whose message
// starts with the file path and names the problem.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "runtime/error.h"

namespace fd {

enum class GgmlType : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };
const char* ggml_type_name(GgmlType type);

// Metadata value types as coded in the file.
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12
};

struct GgufArray;
using GgufValue = std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray>;
struct GgufArray {
  std::vector<GgufValue> items;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the innermost (contiguous) dimension
  GgmlType type;
  uint64_t offset;  // from the start of the data section
  uint64_t n_bytes;
  const uint8_t* data;  // inside the mapping
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);  // throws fd::Error
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  // The raw value: unsigned integers as uint64_t, signed as int64_t, floats as double; nullptr when absent.
  const GgufValue* find(const std::string& key) const;
  // Typed metadata accessors; throw fd::Error naming the key when missing or of the wrong type.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;   // any integer type
  double get_float(const std::string& key) const;  // any float or integer type
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::vector<std::string> get_strings(const std::string& key) const;
  std::vector<double> get_floats(const std::string& key) const;
  std::vector<int64_t> get_ints(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;  // nullptr when absent
  // Dequantized copy of a tensor whose shape must be exactly ne (ggml order; trailing 1s ignored);
  // throws fd::Error naming the tensor for a missing tensor or a wrong shape.
  std::vector<float> read_f32(const std::string& name, const std::vector<uint64_t>& ne) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;  // name -> position in tensors_
};

}  // namespace fd
