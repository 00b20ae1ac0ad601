// Writes GGUF v3 files: metadata is serialized as it is added; tensor data is converted and
// streamed to disk by write(), so a model needs no second copy in memory.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/gguf.h"
#include "runtime/model.h"

namespace fd {

class GgufWriter {
 public:
  // A power of two; recorded as general.alignment (the default, 32, is not recorded).
  void set_alignment(uint32_t alignment);

  void add_u8(const std::string& key, uint8_t v);
  void add_i8(const std::string& key, int8_t v);
  void add_u16(const std::string& key, uint16_t v);
  void add_i16(const std::string& key, int16_t v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_i64(const std::string& key, int64_t v);
  void add_f32(const std::string& key, float v);
  void add_f64(const std::string& key, double v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  // A flat array; each item must hold the alternative GgufFile reports for elem (uint64_t for
  // unsigned, int64_t for signed, double for f32/f64, bool, std::string).
  void add_array(const std::string& key, GgufType elem, const GgufArray& items);
  // An array of arrays; inner[i] is the element type and items of the i-th inner array.
  void add_array_of_arrays(const std::string& key, const std::vector<std::pair<GgufType, GgufArray>>& inner);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);

  // data: product(ne) floats in ggml order, converted to type (f32, f16, bf16, q8_0) by write();
  // it must stay alive until write() returns.
  void add_tensor(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type, const float* data);
  // As above, the writer keeping data.
  void add_tensor(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type, std::vector<float>&& data);

  // Throws fd::Error("PATH: ...") when the file cannot be written.
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;  // ggml order
    GgmlType type;
    uint64_t n_elements;
    uint64_t n_bytes;          // on disk
    const float* external;     // [n_elements] unless owned is used
    std::vector<float> owned;  // [n_elements] or empty
  };
  void begin_kv(const std::string& key, GgufType type);
  void add_tensor_info(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type);

  std::vector<uint8_t> kv_;  // serialized metadata entries
  uint64_t n_kv_ = 0;
  std::set<std::string> keys_;
  uint32_t alignment_ = 32;
  std::vector<Tensor> tensors_;
};

// A complete llama GGUF (llama.* hyper-parameters, tokenizer.ggml.* vocabulary, all tensors) that
// load_model reads back. Matrices and the embedding are stored as dtype, norm weights as f32;
// output.weight is omitted when it equals tok_embd (tied).
void write_model_gguf(const Model& m, const std::string& path, GgmlType dtype);

}  // namespace fd
