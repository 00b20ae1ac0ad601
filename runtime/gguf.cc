#include "runtime/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>

#include "kernels/ops.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF parsing assumes a little-endian host");

namespace fd {
namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;        // bounds the parser's recursion on nested arrays
constexpr uint64_t kMinTensorInfo = 24;  // name length, n_dims, type, offset
constexpr uint64_t kMinKv = 13;          // key length, value type, a one-byte value
constexpr uint64_t kQ8Block = 32;        // values per Q8_0 block
constexpr uint64_t kQ8BlockBytes = 34;   // fp16 scale + 32 int8

// A name read from the file, safe to print: control bytes become '?', long names are cut.
std::string printable(const std::string& name) {
  constexpr size_t kMaxShown = 120;
  std::string s = name.substr(0, kMaxShown);
  for (char& ch : s) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
  }
  return name.size() > kMaxShown ? s + "..." : s;
}

// Names of the ggml types this reader does not support, for error messages.
std::string ggml_type_label(uint32_t type) {
  static constexpr const char* kNames[] = {
      "f32",   "f16",    "q4_0", "q4_1", "q4_2", "q4_3",    "q5_0",   "q5_1",    "q8_0",  "q8_1",   "q2_k",
      "q3_k",  "q4_k",   "q5_k", "q6_k", "q8_k", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s",
      "iq2_s", "iq4_xs", "i8",   "i16",  "i32",  "i64",     "f64",    "iq1_m",   "bf16"};
  return type < std::size(kNames) ? std::to_string(type) + " (" + kNames[type] + ")" : std::to_string(type);
}

std::string shape_str(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

std::vector<uint64_t> strip_trailing_ones(std::vector<uint64_t> ne) {
  while (!ne.empty() && ne.back() == 1) ne.pop_back();
  return ne;
}

uint64_t min_value_bytes(uint32_t type) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string:
      return 8;
    case GgufType::array:
      return 12;
  }
  return 0;
}

bool is_supported(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::f32:
    case GgmlType::f16:
    case GgmlType::q8_0:
    case GgmlType::bf16:
      return true;
  }
  return false;
}

// Bounds-checked little-endian reader over the mapping; every failure names the file and the
// item being read (the context).
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, size_t size) : path_(path), data_(data), size_(size) {}

  [[noreturn]] void fail(const std::string& problem) const { throw Error(path_ + ": " + problem); }
  void set_context(std::string what) { context_ = std::move(what); }
  const std::string& context() const { return context_; }
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  const uint8_t* take(uint64_t n) {
    if (n > remaining()) {
      fail("truncated file (" + context_ + " needs " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
           ", file has " + std::to_string(size_) + ")");
    }
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  template <class T>
  T read() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }

  std::string read_string() {
    const size_t at = pos_;
    const uint64_t n = read<uint64_t>();
    if (n > remaining()) {
      fail(context_ + " has a string length of " + std::to_string(n) + " bytes at offset " + std::to_string(at) +
           ", but only " + std::to_string(remaining()) + " bytes of the file remain (truncated or corrupt file)");
    }
    const uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }

  GgufValue read_value(uint32_t type, int depth) {
    switch (static_cast<GgufType>(type)) {
      case GgufType::u8:
        return uint64_t{read<uint8_t>()};
      case GgufType::i8:
        return int64_t{read<int8_t>()};
      case GgufType::u16:
        return uint64_t{read<uint16_t>()};
      case GgufType::i16:
        return int64_t{read<int16_t>()};
      case GgufType::u32:
        return uint64_t{read<uint32_t>()};
      case GgufType::i32:
        return int64_t{read<int32_t>()};
      case GgufType::u64:
        return read<uint64_t>();
      case GgufType::i64:
        return read<int64_t>();
      case GgufType::f32:
        return double{read<float>()};
      case GgufType::f64:
        return read<double>();
      case GgufType::boolean: {
        const uint8_t b = read<uint8_t>();
        if (b > 1)
          fail(context_ + " has an invalid bool value " + std::to_string(b) + " at offset " + std::to_string(pos_ - 1));
        return b == 1;
      }
      case GgufType::string:
        return read_string();
      case GgufType::array:
        return read_array(depth);
    }
    fail(context_ + " has unknown metadata value type " + std::to_string(type) + " (offset " +
         std::to_string(pos_ - 4) + ")");
  }

 private:
  GgufArray read_array(int depth) {
    if (depth >= kMaxArrayDepth)
      fail(context_ + " has arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
    const uint32_t elem = read<uint32_t>();
    const uint64_t min_bytes = min_value_bytes(elem);
    if (min_bytes == 0) {
      fail(context_ + " has an array of unknown metadata value type " + std::to_string(elem) + " (offset " +
           std::to_string(pos_ - 4) + ")");
    }
    const size_t at = pos_;
    const uint64_t n = read<uint64_t>();
    if (n > remaining() / min_bytes) {
      fail(context_ + " claims an array of " + std::to_string(n) + " elements at offset " + std::to_string(at) +
           ", more than the remaining " + std::to_string(remaining()) +
           " bytes of the file can hold (truncated or corrupt file)");
    }
    GgufArray a;
    a.items.reserve(n);
    for (uint64_t i = 0; i < n; ++i) a.items.push_back(read_value(elem, depth + 1));
    return a;
  }

  const std::string& path_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string context_ = "header";
};

uint64_t tensor_bytes(const Cursor& c, const std::string& shown, const std::vector<uint64_t>& ne, GgmlType type) {
  uint64_t n = 1;
  for (uint64_t d : ne) {
    if (__builtin_mul_overflow(n, d, &n) || n > uint64_t{std::numeric_limits<int64_t>::max()}) {
      c.fail(shown + " has an impossible shape " + shape_str(ne) + " (element count overflows)");
    }
  }
  switch (type) {
    case GgmlType::f32:
    case GgmlType::f16:
    case GgmlType::bf16: {
      uint64_t bytes;
      if (__builtin_mul_overflow(n, type == GgmlType::f32 ? 4 : 2, &bytes)) {
        c.fail(shown + " has an impossible shape " + shape_str(ne) + " (byte count overflows)");
      }
      return bytes;
    }
    case GgmlType::q8_0:
      if (ne.empty() || ne[0] % kQ8Block != 0) {
        c.fail(shown + " of type q8_0 has ne[0] = " + std::to_string(ne.empty() ? 1 : ne[0]) +
               ", not a multiple of the block size 32");
      }
      return n / kQ8Block * kQ8BlockBytes;
  }
  return 0;
}

void dequantize(const GgufTensorInfo& t, uint64_t n, float* out) {
  switch (t.type) {
    case GgmlType::f32:
      std::memcpy(out, t.data, n * sizeof(float));
      return;
    case GgmlType::f16: {
      constexpr uint64_t kChunk = 4096;
      uint16_t buf[kChunk];  // the mapping may not be 2-byte aligned
      for (uint64_t i = 0; i < n; i += kChunk) {
        const uint64_t m = std::min(kChunk, n - i);
        std::memcpy(buf, t.data + 2 * i, 2 * m);
        kernels::f16_to_f32(buf, out + i, m);
      }
      return;
    }
    case GgmlType::bf16:
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        const uint32_t bits = uint32_t{h} << 16;
        std::memcpy(out + i, &bits, 4);
      }
      return;
    case GgmlType::q8_0:
      for (uint64_t b = 0; b < n / kQ8Block; ++b) {
        const uint8_t* block = t.data + b * kQ8BlockBytes;
        uint16_t dh;
        std::memcpy(&dh, block, 2);
        float d;
        kernels::f16_to_f32(&dh, &d, 1);
        const auto* q = reinterpret_cast<const int8_t*>(block + 2);
        for (uint64_t j = 0; j < kQ8Block; ++j) out[b * kQ8Block + j] = d * static_cast<float>(q[j]);
      }
      return;
  }
}

}  // namespace

const char* ggml_type_name(GgmlType type) {
  switch (type) {
    case GgmlType::f32:
      return "f32";
    case GgmlType::f16:
      return "f16";
    case GgmlType::q8_0:
      return "q8_0";
    case GgmlType::bf16:
      return "bf16";
  }
  return "unknown";
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(path + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd_);
      throw Error(path + ": cannot map the file into memory (" + std::strerror(err) + ")");
    }
    map_ = static_cast<const uint8_t*>(m);
  }
  try {
    Cursor c(path_, map_, size_);
    const uint8_t* magic = c.take(4);
    if (std::memcmp(magic, kMagic, 4) != 0) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "%02x %02x %02x %02x", magic[0], magic[1], magic[2], magic[3]);
      c.fail(std::string("not a GGUF file (bad magic bytes ") + hex + ")");
    }
    version_ = c.read<uint32_t>();
    if (version_ != 2 && version_ != 3) {
      c.fail("unsupported GGUF version " + std::to_string(version_) + " (versions 2 and 3 are supported)");
    }
    const uint64_t n_tensors = c.read<uint64_t>();
    const uint64_t n_kv = c.read<uint64_t>();
    if (n_tensors > c.remaining() / kMinTensorInfo) {
      c.fail("header claims " + std::to_string(n_tensors) + " tensors, more than the remaining " +
             std::to_string(c.remaining()) + " bytes of the file can hold (truncated or corrupt file)");
    }
    if (n_kv > c.remaining() / kMinKv) {
      c.fail("header claims " + std::to_string(n_kv) + " metadata entries, more than the remaining " +
             std::to_string(c.remaining()) + " bytes of the file can hold (truncated or corrupt file)");
    }

    for (uint64_t i = 0; i < n_kv; ++i) {
      c.set_context("metadata entry " + std::to_string(i));
      std::string key = c.read_string();
      c.set_context("metadata '" + printable(key) + "'");
      const uint32_t type = c.read<uint32_t>();
      GgufValue value = c.read_value(type, 0);
      if (!kv_.emplace(std::move(key), std::move(value)).second) c.fail("duplicate " + c.context());
    }

    uint64_t alignment = 32;
    if (const GgufValue* a = find("general.alignment")) {
      const uint64_t* v = std::get_if<uint64_t>(a);
      if (!v || *v == 0 || (*v & (*v - 1)) != 0 || *v > (uint64_t{1} << 30)) {
        c.fail("metadata 'general.alignment' must be an unsigned power of two");
      }
      alignment = *v;
    }

    tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      c.set_context("tensor info " + std::to_string(i));
      GgufTensorInfo t;
      t.name = c.read_string();
      const std::string shown = "tensor '" + printable(t.name) + "'";
      c.set_context("tensor info " + std::to_string(i) + " ('" + printable(t.name) + "')");
      const uint32_t n_dims = c.read<uint32_t>();
      if (n_dims > kMaxDims) {
        c.fail(shown + " has " + std::to_string(n_dims) + " dimensions (at most " + std::to_string(kMaxDims) +
               " are supported)");
      }
      t.ne.resize(n_dims);
      for (uint64_t& d : t.ne) d = c.read<uint64_t>();
      const uint32_t type = c.read<uint32_t>();
      if (!is_supported(type)) {
        c.fail(shown + " has unsupported type " + ggml_type_label(type) +
               "; supported types are f32 (0), f16 (1), q8_0 (8) and bf16 (30)");
      }
      t.type = static_cast<GgmlType>(type);
      t.offset = c.read<uint64_t>();
      t.n_bytes = tensor_bytes(c, shown, t.ne, t.type);
      t.data = nullptr;
      if (!tensor_index_.emplace(t.name, tensors_.size()).second)
        c.fail("duplicate tensor name '" + printable(t.name) + "'");
      tensors_.push_back(std::move(t));
    }

    const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
    const uint64_t avail = size_ > data_start ? size_ - data_start : 0;
    for (GgufTensorInfo& t : tensors_) {
      if (t.offset % alignment != 0) {
        c.fail("tensor '" + printable(t.name) + "' data offset " + std::to_string(t.offset) +
               " is not a multiple of the alignment " + std::to_string(alignment));
      }
      if (t.offset > avail || t.n_bytes > avail - t.offset) {
        c.fail("tensor '" + printable(t.name) + "' data (" + std::to_string(t.n_bytes) + " bytes at offset " +
               std::to_string(t.offset) + " of the data section, which starts at " + std::to_string(data_start) +
               ") extends past the end of the file (" + std::to_string(size_) +
               " bytes): the file is truncated or the offset is wrong");
      }
      t.data = map_ + data_start + t.offset;
    }
  } catch (...) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    ::close(fd_);
    throw;
  }
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
  if (fd_ >= 0) ::close(fd_);
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {

[[noreturn]] void key_error(const std::string& path, const std::string& key, const char* problem) {
  throw Error(path + ": metadata '" + key + "' " + problem);
}

bool as_int(const GgufValue& v, int64_t* out) {
  if (const auto* i = std::get_if<int64_t>(&v)) {
    *out = *i;
    return true;
  }
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    if (*u > uint64_t{std::numeric_limits<int64_t>::max()}) return false;
    *out = static_cast<int64_t>(*u);
    return true;
  }
  return false;
}

bool as_float(const GgufValue& v, double* out) {
  if (const auto* d = std::get_if<double>(&v)) {
    *out = *d;
    return true;
  }
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    *out = static_cast<double>(*u);
    return true;
  }
  if (const auto* i = std::get_if<int64_t>(&v)) {
    *out = static_cast<double>(*i);
    return true;
  }
  return false;
}

}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  const auto* s = std::get_if<std::string>(v);
  if (!s) key_error(path_, key, "is not a string");
  return *s;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  int64_t out;
  if (!as_int(*v, &out)) key_error(path_, key, "is not an integer in the range of int64");
  return out;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  double out;
  if (!as_float(*v, &out)) key_error(path_, key, "is not a number");
  return out;
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const { return has(key) ? get_int(key) : fallback; }

double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  const auto* b = std::get_if<bool>(v);
  if (!b) key_error(path_, key, "is not a bool");
  return *b;
}

std::vector<std::string> GgufFile::get_strings(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  const auto* a = std::get_if<GgufArray>(v);
  if (!a) key_error(path_, key, "is not an array of strings");
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const GgufValue& item : a->items) {
    const auto* s = std::get_if<std::string>(&item);
    if (!s) key_error(path_, key, "is not an array of strings");
    out.push_back(*s);
  }
  return out;
}

std::vector<double> GgufFile::get_floats(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  const auto* a = std::get_if<GgufArray>(v);
  if (!a) key_error(path_, key, "is not an array of numbers");
  std::vector<double> out(a->items.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!as_float(a->items[i], &out[i])) key_error(path_, key, "is not an array of numbers");
  }
  return out;
}

std::vector<int64_t> GgufFile::get_ints(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  const auto* a = std::get_if<GgufArray>(v);
  if (!a) key_error(path_, key, "is not an array of integers");
  std::vector<int64_t> out(a->items.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!as_int(a->items[i], &out[i])) key_error(path_, key, "is not an array of integers");
  }
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> GgufFile::read_f32(const std::string& name, const std::vector<uint64_t>& ne) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) throw Error(path_ + ": missing tensor '" + name + "'");
  if (strip_trailing_ones(t->ne) != strip_trailing_ones(ne)) {
    throw Error(path_ + ": tensor '" + name + "' has shape " + shape_str(t->ne) + " but " + shape_str(ne) +
                " was expected");
  }
  uint64_t n = 1;
  for (uint64_t d : t->ne) n *= d;  // bounded by the file size at parse time
  std::vector<float> out(n);
  dequantize(*t, n, out.data());
  return out;
}

}  // namespace fd
