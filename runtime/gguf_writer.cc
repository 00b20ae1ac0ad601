#include "runtime/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "kernels/ops.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF writing assumes a little-endian host");

namespace fd {
namespace {

constexpr uint64_t kQ8Block = 32;       // values per Q8_0 block
constexpr uint64_t kQ8BlockBytes = 34;  // fp16 scale + 32 int8
constexpr uint64_t kChunk = 1 << 16;    // values converted per write; a multiple of kQ8Block

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

[[noreturn]] void bad_item(const std::string& key, GgufType t) {
  throw Error("GGUF writer: an item of metadata '" + key + "' does not fit value type " +
              std::to_string(static_cast<uint32_t>(t)));
}

uint64_t unsigned_item(const std::string& key, GgufType t, const GgufValue& v, uint64_t max) {
  const auto* u = std::get_if<uint64_t>(&v);
  if (!u || *u > max) bad_item(key, t);
  return *u;
}

int64_t signed_item(const std::string& key, GgufType t, const GgufValue& v, int64_t min, int64_t max) {
  const auto* i = std::get_if<int64_t>(&v);
  if (!i || *i < min || *i > max) bad_item(key, t);
  return *i;
}

void put_item(std::vector<uint8_t>& out, const std::string& key, GgufType t, const GgufValue& v) {
  switch (t) {
    case GgufType::u8:
      put<uint8_t>(out, unsigned_item(key, t, v, UINT8_MAX));
      return;
    case GgufType::u16:
      put<uint16_t>(out, unsigned_item(key, t, v, UINT16_MAX));
      return;
    case GgufType::u32:
      put<uint32_t>(out, unsigned_item(key, t, v, UINT32_MAX));
      return;
    case GgufType::u64:
      put<uint64_t>(out, unsigned_item(key, t, v, UINT64_MAX));
      return;
    case GgufType::i8:
      put<int8_t>(out, signed_item(key, t, v, INT8_MIN, INT8_MAX));
      return;
    case GgufType::i16:
      put<int16_t>(out, signed_item(key, t, v, INT16_MIN, INT16_MAX));
      return;
    case GgufType::i32:
      put<int32_t>(out, signed_item(key, t, v, INT32_MIN, INT32_MAX));
      return;
    case GgufType::i64:
      put<int64_t>(out, signed_item(key, t, v, INT64_MIN, INT64_MAX));
      return;
    case GgufType::f32:
    case GgufType::f64: {
      const auto* d = std::get_if<double>(&v);
      if (!d) bad_item(key, t);
      if (t == GgufType::f32) {
        put<float>(out, static_cast<float>(*d));
      } else {
        put<double>(out, *d);
      }
      return;
    }
    case GgufType::boolean: {
      const auto* b = std::get_if<bool>(&v);
      if (!b) bad_item(key, t);
      put<uint8_t>(out, *b ? 1 : 0);
      return;
    }
    case GgufType::string: {
      const auto* s = std::get_if<std::string>(&v);
      if (!s) bad_item(key, t);
      put_string(out, *s);
      return;
    }
    case GgufType::array:
      break;
  }
  throw Error("GGUF writer: metadata '" + key + "' uses add_array for nested arrays; use add_array_of_arrays");
}

void put_array(std::vector<uint8_t>& out, const std::string& key, GgufType elem, const GgufArray& items) {
  put<uint32_t>(out, static_cast<uint32_t>(elem));
  put<uint64_t>(out, items.items.size());
  for (const GgufValue& v : items.items) put_item(out, key, elem, v);
}

uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stay a quiet NaN
  bits += 0x7fff + ((bits >> 16) & 1);                                   // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// ggml's reference quantizer: per block d = max|x| / 127, q = round(x / d).
void quantize_q8_0(const float* x, uint64_t n, uint8_t* out) {
  for (uint64_t b = 0; b < n / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    float amax = 0.0f;
    for (uint64_t j = 0; j < kQ8Block; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* block = out + b * kQ8BlockBytes;
    uint16_t dh;
    kernels::f32_to_f16(&d, &dh, 1);
    std::memcpy(block, &dh, 2);
    for (uint64_t j = 0; j < kQ8Block; ++j) {
      const auto q = static_cast<int8_t>(std::lround(xb[j] * id));
      std::memcpy(block + 2 + j, &q, 1);
    }
  }
}

uint64_t encoded_bytes(GgmlType type, uint64_t n) {
  switch (type) {
    case GgmlType::f32:
      return 4 * n;
    case GgmlType::f16:
    case GgmlType::bf16:
      return 2 * n;
    case GgmlType::q8_0:
      return n / kQ8Block * kQ8BlockBytes;
  }
  return 0;
}

void encode(GgmlType type, const float* x, uint64_t n, uint8_t* out) {
  switch (type) {
    case GgmlType::f32:
      std::memcpy(out, x, 4 * n);
      return;
    case GgmlType::f16: {
      std::vector<uint16_t> h(n);
      kernels::f32_to_f16(x, h.data(), n);
      std::memcpy(out, h.data(), 2 * n);
      return;
    }
    case GgmlType::bf16:
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::q8_0:
      quantize_q8_0(x, n, out);
      return;
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

class OutFile {
 public:
  explicit OutFile(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    if (!f_) throw Error(path + ": cannot create file (" + std::strerror(errno) + ")");
  }
  ~OutFile() {
    if (f_) {
      std::fclose(f_);
      std::remove(path_.c_str());  // only reached when writing failed
    }
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, f_) != n) fail();
    written_ += n;
  }
  void pad_to(uint64_t alignment) {
    static constexpr uint8_t kZeros[64] = {};
    uint64_t pad = align_up(written_, alignment) - written_;
    while (pad > 0) {
      const uint64_t m = std::min<uint64_t>(pad, sizeof kZeros);
      write(kZeros, m);
      pad -= m;
    }
  }
  void close() {
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) {
      const int err = errno;
      std::remove(path_.c_str());
      throw Error(path_ + ": cannot write file (" + std::strerror(err) + ")");
    }
  }

 private:
  [[noreturn]] void fail() { throw Error(path_ + ": cannot write file (" + std::strerror(errno) + ")"); }
  std::string path_;
  std::FILE* f_;
  uint64_t written_ = 0;
};

}  // namespace

void GgufWriter::set_alignment(uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw Error("GGUF writer: alignment " + std::to_string(alignment) + " is not a power of two");
  }
  add_u32("general.alignment", alignment);
  alignment_ = alignment;
}

void GgufWriter::begin_kv(const std::string& key, GgufType type) {
  if (!keys_.insert(key).second) throw Error("GGUF writer: duplicate metadata key '" + key + "'");
  put_string(kv_, key);
  put<uint32_t>(kv_, static_cast<uint32_t>(type));
  ++n_kv_;
}

void GgufWriter::add_u8(const std::string& key, uint8_t v) {
  begin_kv(key, GgufType::u8);
  put(kv_, v);
}
void GgufWriter::add_i8(const std::string& key, int8_t v) {
  begin_kv(key, GgufType::i8);
  put(kv_, v);
}
void GgufWriter::add_u16(const std::string& key, uint16_t v) {
  begin_kv(key, GgufType::u16);
  put(kv_, v);
}
void GgufWriter::add_i16(const std::string& key, int16_t v) {
  begin_kv(key, GgufType::i16);
  put(kv_, v);
}
void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  begin_kv(key, GgufType::u32);
  put(kv_, v);
}
void GgufWriter::add_i32(const std::string& key, int32_t v) {
  begin_kv(key, GgufType::i32);
  put(kv_, v);
}
void GgufWriter::add_u64(const std::string& key, uint64_t v) {
  begin_kv(key, GgufType::u64);
  put(kv_, v);
}
void GgufWriter::add_i64(const std::string& key, int64_t v) {
  begin_kv(key, GgufType::i64);
  put(kv_, v);
}
void GgufWriter::add_f32(const std::string& key, float v) {
  begin_kv(key, GgufType::f32);
  put(kv_, v);
}
void GgufWriter::add_f64(const std::string& key, double v) {
  begin_kv(key, GgufType::f64);
  put(kv_, v);
}

void GgufWriter::add_bool(const std::string& key, bool v) {
  begin_kv(key, GgufType::boolean);
  put<uint8_t>(kv_, v ? 1 : 0);
}

void GgufWriter::add_string(const std::string& key, const std::string& v) {
  begin_kv(key, GgufType::string);
  put_string(kv_, v);
}

void GgufWriter::add_array(const std::string& key, GgufType elem, const GgufArray& items) {
  std::vector<uint8_t> value;  // serialized first so that a bad item leaves the writer unchanged
  put_array(value, key, elem, items);
  begin_kv(key, GgufType::array);
  kv_.insert(kv_.end(), value.begin(), value.end());
}

void GgufWriter::add_array_of_arrays(const std::string& key, const std::vector<std::pair<GgufType, GgufArray>>& inner) {
  std::vector<uint8_t> value;
  put<uint32_t>(value, static_cast<uint32_t>(GgufType::array));
  put<uint64_t>(value, inner.size());
  for (const auto& [elem, items] : inner) put_array(value, key, elem, items);
  begin_kv(key, GgufType::array);
  kv_.insert(kv_.end(), value.begin(), value.end());
}

void GgufWriter::add_strings(const std::string& key, const std::vector<std::string>& v) {
  begin_kv(key, GgufType::array);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::string));
  put<uint64_t>(kv_, v.size());
  for (const std::string& s : v) put_string(kv_, s);
}

void GgufWriter::add_f32s(const std::string& key, const std::vector<float>& v) {
  begin_kv(key, GgufType::array);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::f32));
  put<uint64_t>(kv_, v.size());
  for (float x : v) put(kv_, x);
}

void GgufWriter::add_i32s(const std::string& key, const std::vector<int32_t>& v) {
  begin_kv(key, GgufType::array);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::i32));
  put<uint64_t>(kv_, v.size());
  for (int32_t x : v) put(kv_, x);
}

void GgufWriter::add_tensor_info(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type) {
  if (ne.size() > 4) throw Error("GGUF writer: tensor '" + name + "' has more than 4 dimensions");
  for (const Tensor& t : tensors_) {
    if (t.name == name) throw Error("GGUF writer: duplicate tensor name '" + name + "'");
  }
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  if (type == GgmlType::q8_0 && (ne.empty() || ne[0] % kQ8Block != 0)) {
    throw Error("GGUF writer: tensor '" + name + "' cannot be stored as q8_0: ne[0] is not a multiple of 32");
  }
  tensors_.push_back(Tensor{name, ne, type, n, encoded_bytes(type, n), nullptr, {}});
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type,
                            const float* data) {
  add_tensor_info(name, ne, type);
  tensors_.back().external = data;
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type,
                            std::vector<float>&& data) {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  if (data.size() != n) {
    throw Error("GGUF writer: tensor '" + name + "' has " + std::to_string(data.size()) + " values for " +
                std::to_string(n) + " elements");
  }
  add_tensor_info(name, ne, type);
  tensors_.back().owned = std::move(data);
}

void GgufWriter::write(const std::string& path) const {
  std::vector<uint8_t> head;
  head.insert(head.end(), {'G', 'G', 'U', 'F'});
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, n_kv_);
  head.insert(head.end(), kv_.begin(), kv_.end());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) put(head, d);
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offset = align_up(offset + t.n_bytes, alignment_);
  }

  OutFile out(path);
  out.write(head.data(), head.size());
  out.pad_to(alignment_);
  std::vector<uint8_t> buf(encoded_bytes(GgmlType::f32, kChunk));
  for (const Tensor& t : tensors_) {
    const float* src = t.owned.empty() ? t.external : t.owned.data();
    for (uint64_t i = 0; i < t.n_elements; i += kChunk) {
      const uint64_t m = std::min(kChunk, t.n_elements - i);
      encode(t.type, src + i, m, buf.data());
      out.write(buf.data(), encoded_bytes(t.type, m));
    }
    out.pad_to(alignment_);
  }
  out.close();
}

namespace {

void check_size(const std::string& path, const char* what, size_t have, uint64_t want) {
  if (have != want) {
    throw Error(path + ": cannot write the model: " + what + " has " + std::to_string(have) + " values, expected " +
                std::to_string(want));
  }
}

uint32_t file_type(GgmlType dtype) {  // llama_ftype
  switch (dtype) {
    case GgmlType::f32:
      return 0;
    case GgmlType::f16:
      return 1;
    case GgmlType::q8_0:
      return 7;
    case GgmlType::bf16:
      return 32;
  }
  return 0;
}

}  // namespace

void write_model_gguf(const Model& m, const std::string& path, GgmlType dtype) {
  const ModelConfig& c = m.cfg;
  const uint64_t dim = c.dim, q = c.q_width(), kv = c.kv_width(), ff = c.ff, vocab = c.vocab;
  check_size(path, "tok_embd", m.tok_embd.size(), vocab * dim);
  check_size(path, "out_norm", m.out_norm.size(), dim);
  check_size(path, "output", m.output.size(), vocab * dim);
  check_size(path, "layers", m.layers.size(), c.n_layers);
  check_size(path, "vocab", m.vocab.pieces.size(), vocab);
  check_size(path, "vocab scores", m.vocab.scores.size(), vocab);
  check_size(path, "vocab types", m.vocab.types.size(), vocab);
  for (const LayerWeights& l : m.layers) {
    check_size(path, "attn_norm", l.attn_norm.size(), dim);
    check_size(path, "wq", l.wq.size(), q * dim);
    check_size(path, "wk", l.wk.size(), kv * dim);
    check_size(path, "wv", l.wv.size(), kv * dim);
    check_size(path, "wo", l.wo.size(), dim * q);
    check_size(path, "ffn_norm", l.ffn_norm.size(), dim);
    check_size(path, "w_gate", l.w_gate.size(), ff * dim);
    check_size(path, "w_up", l.w_up.size(), ff * dim);
    check_size(path, "w_down", l.w_down.size(), dim * ff);
  }

  if (dtype == GgmlType::q8_0 && (dim % kQ8Block != 0 || q % kQ8Block != 0 || ff % kQ8Block != 0)) {
    throw Error(path + ": cannot write the model as q8_0: dim, n_heads*head_dim and ff must be multiples of 32");
  }

  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", m.name);
  w.add_u32("general.file_type", file_type(dtype));
  w.add_u32("llama.vocab_size", c.vocab);
  w.add_u32("llama.context_length", c.ctx);
  w.add_u32("llama.embedding_length", c.dim);
  w.add_u32("llama.block_count", c.n_layers);
  w.add_u32("llama.feed_forward_length", c.ff);
  w.add_u32("llama.rope.dimension_count", c.head_dim);
  w.add_u32("llama.attention.head_count", c.n_heads);
  w.add_u32("llama.attention.head_count_kv", c.n_kv_heads);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", c.rms_eps);
  w.add_f32("llama.rope.freq_base", c.rope_base);

  const Vocab& v = m.vocab;
  std::vector<int32_t> types(v.types.size());
  std::transform(v.types.begin(), v.types.end(), types.begin(), [](TokenType t) { return static_cast<int32_t>(t); });
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_strings("tokenizer.ggml.tokens", v.pieces);
  w.add_f32s("tokenizer.ggml.scores", v.scores);
  w.add_i32s("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos));
  w.add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(v.unk));
  w.add_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
  w.add_bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);

  w.add_tensor("token_embd.weight", {dim, vocab}, dtype, m.tok_embd.data());
  w.add_tensor("output_norm.weight", {dim}, GgmlType::f32, m.out_norm.data());
  if (m.output != m.tok_embd) w.add_tensor("output.weight", {dim, vocab}, dtype, m.output.data());
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerWeights& l = m.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    w.add_tensor(p + "attn_norm.weight", {dim}, GgmlType::f32, l.attn_norm.data());
    w.add_tensor(p + "attn_q.weight", {dim, q}, dtype, l.wq.data());
    w.add_tensor(p + "attn_k.weight", {dim, kv}, dtype, l.wk.data());
    w.add_tensor(p + "attn_v.weight", {dim, kv}, dtype, l.wv.data());
    w.add_tensor(p + "attn_output.weight", {q, dim}, dtype, l.wo.data());
    w.add_tensor(p + "ffn_norm.weight", {dim}, GgmlType::f32, l.ffn_norm.data());
    w.add_tensor(p + "ffn_gate.weight", {dim, ff}, dtype, l.w_gate.data());
    w.add_tensor(p + "ffn_up.weight", {dim, ff}, dtype, l.w_up.data());
    w.add_tensor(p + "ffn_down.weight", {ff, dim}, dtype, l.w_down.data());
  }
  w.write(path);
}

}  // namespace fd
