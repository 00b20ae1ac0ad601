#include "kernels/kv_format.h"

#include <algorithm>
#include <cstring>

#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "kernels/stream.h"
#include "kernels/transpose.h"

namespace fd::kernels {
namespace {

constexpr int kMaxHeadDim = 256;  // attention keeps a head's accumulators on the stack

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Moves the keys at `data`, 16-bit elements, between rows [bt][cols] and groups of `group` rows
// (the last one as many as are left), each [cols][group], by way of scratch.
void relayout_key_groups(uint8_t* data, size_t cols, size_t bt, size_t group, uint8_t* scratch, bool seal) {
  std::memcpy(scratch, data, bt * cols * sizeof(uint16_t));
  const auto* from = reinterpret_cast<const uint16_t*>(scratch);
  auto* to = reinterpret_cast<uint16_t*>(data);
  for (size_t start = 0; start < bt; start += group) {
    const size_t width = std::min(group, bt - start), at = start * cols;
    if (seal)
      transpose_u16(from + at, width, cols, cols, to + at, width);
    else
      transpose_u16(from + at, cols, width, width, to + at, cols);
  }
}
// Fetches the cache lines of bytes [p, p + n) for writing.
void fetch_for_write(const uint8_t* p, size_t n) {
  constexpr size_t kLine = 64;
  const size_t skip = reinterpret_cast<uintptr_t>(p) % kLine;  // bytes of the first line before p
  for (size_t at = 0; at < skip + n; at += kLine) __builtin_prefetch(p - skip + at, 1, 3);
}
// Scale i of a q8 or q4 head block, whose fp16 scales start the block, as fp32.
float scale_at(const uint8_t* head_block, size_t i) {
  uint16_t h;
  std::memcpy(&h, head_block + i * sizeof(uint16_t), sizeof h);
  float v;
  f16_to_f32(&h, &v, 1);
  return v;
}

class KvFormatBase : public KvFormat {
 public:
  void attend(const float* q, int n_q, int q_pos0, const KvBlocks& kv, const AttnDims& d,
              int kvh_begin, int kvh_end, float* out, float* stats) const override {
    detail::attend_heads(q, n_q, q_pos0, kv, head_block_bytes(kv.block_tokens, d.head_dim), d,
                         kvh_begin, kvh_end, out, stats);
  }
};

class QuantFormatBase : public KvFormat {
 public:
  void attend(const float* q, int n_q, int q_pos0, const KvBlocks& kv, const AttnDims& d,
              int kvh_begin, int kvh_end, float* out, float* stats) const override {
    detail::attend_quant_heads(q, n_q, q_pos0, kv, head_block_bytes(kv.block_tokens, d.head_dim), d,
                               kvh_begin, kvh_end, out, stats);
  }
};

class F16Format final : public KvFormatBase {
 public:
  KvDtype dtype() const override { return KvDtype::f16; }
  const char* name() const override { return "f16"; }
  bool supports(int hd) const override { return hd > 0 && hd <= kMaxHeadDim; }
  std::string head_dims() const override { return "head_dim 1 to " + std::to_string(kMaxHeadDim); }
  size_t head_block_bytes(int bt, int hd) const override {
    return size_t(bt) * size_t(hd) * sizeof(uint16_t);
  }
  KvLayout layout(int, int) const override { return f16_layout(); }
  void encode_row(KvPart, const uint16_t* src, int hd, int, int t, uint8_t* hb) const override {
    copy_streaming(hb + size_t(t) * hd * sizeof(uint16_t), src, size_t(hd) * sizeof(uint16_t));
  }
  void decode_row(KvPart, const uint8_t* hb, int hd, int, int t, float* dst) const override {
    uint16_t row[kMaxHeadDim];
    std::memcpy(row, hb + size_t(t) * hd * sizeof(uint16_t), size_t(hd) * sizeof(uint16_t));
    f16_to_f32(row, dst, size_t(hd));
  }
  void seal(KvPart part, uint8_t* hb, int hd, int bt, uint8_t* scratch) const override {
    relayout_f16(part, hb, size_t(hd), size_t(bt), scratch, true);
  }
  void unseal(KvPart part, uint8_t* hb, int hd, int bt, uint8_t* scratch) const override {
    relayout_f16(part, hb, size_t(hd), size_t(bt), scratch, false);
  }

 private:
  // Keys are transposed per group, values move a chunk row (up to 16 elements) at a time, by way
  // of scratch. A whole chunk row is a copy of fixed size, which the compiler inlines: a library
  // call per row took a third of sealing values.
  static void relayout_f16(KvPart part, uint8_t* hb, size_t hd, size_t bt, uint8_t* scratch, bool seal) {
    constexpr size_t e = sizeof(uint16_t);
    if (part == KvPart::key) return relayout_key_groups(hb, hd, bt, kF16KeyGroup, scratch, seal);
    std::memcpy(scratch, hb, bt * hd * e);
    for (size_t c0 = 0; c0 < hd; c0 += kF16ValueChunk) {
      const size_t width = detail::run_of(c0, kF16ValueChunk, hd).width;
      for (size_t t = 0; t < bt; ++t) {
        const size_t at_rows = (t * hd + c0) * e, at_sealed = detail::f16_sealed_value_index(t, c0, hd, bt) * e;
        uint8_t* to = hb + (seal ? at_sealed : at_rows);
        const uint8_t* from = scratch + (seal ? at_rows : at_sealed);
        if (width == kF16ValueChunk)
          std::memcpy(to, from, kF16ValueChunk * e);
        else
          std::memcpy(to, from, width * e);
      }
    }
  }
};

class Q8Format final : public QuantFormatBase {
 public:
  KvDtype dtype() const override { return KvDtype::q8; }
  const char* name() const override { return "int8"; }
  bool supports(int hd) const override { return hd > 0 && hd <= kMaxHeadDim; }
  std::string head_dims() const override { return "head_dim 1 to " + std::to_string(kMaxHeadDim); }
  size_t head_block_bytes(int bt, int hd) const override {
    return round_up(detail::q8_data_offset(size_t(bt)) + round_up(size_t(bt), 4) * size_t(hd), 64);
  }
  KvLayout layout(int bt, int hd) const override { return q8_layout(head_block_bytes(bt, hd)); }
  void encode_row(KvPart part, const uint16_t* src, int hd, int bt, int t, uint8_t* hb) const override {
    auto* data = reinterpret_cast<int8_t*>(hb + detail::q8_data_offset(size_t(bt)));
    uint16_t scale;
    if (part == KvPart::key) {  // quantized in place
      scale = quantize_row_q8(src, size_t(hd), data + detail::q8_key_index(false, size_t(t), 0, size_t(hd), size_t(bt)));
    } else {
      int8_t q[kMaxHeadDim];
      scale = quantize_row_q8(src, size_t(hd), q);
      for (size_t c0 = 0; c0 < size_t(hd); c0 += kQ8ValueChunk) {
        // Every 4th byte, a store each: loading, blending and storing whole words was no faster
        // (AMD EPYC Zen 3), as the loads wait for lines the stores would not.
        int8_t* row = data + detail::q8_value_index(size_t(t), c0, size_t(hd), size_t(bt));
        const size_t width = detail::run_of(c0, kQ8ValueChunk, size_t(hd)).width;
        for (size_t i = 0; i < width; ++i) row[4 * i] = q[c0 + i];
      }
    }
    std::memcpy(hb + size_t(t) * sizeof(uint16_t), &scale, sizeof scale);
  }
  void prefetch_row(KvPart part, int hd, int bt, int t, const uint8_t* hb) const override {
    fetch_for_write(hb + size_t(t) * sizeof(uint16_t), sizeof(uint16_t));
    const uint8_t* data = hb + detail::q8_data_offset(size_t(bt));
    if (part == KvPart::key) return fetch_for_write(data + size_t(t) * size_t(hd), size_t(hd));
    for (size_t c0 = 0; c0 < size_t(hd); c0 += kQ8ValueChunk)
      fetch_for_write(data + detail::q8_value_index(size_t(t), c0, size_t(hd), size_t(bt)) - size_t(t) % 4,
                      4 * detail::run_of(c0, kQ8ValueChunk, size_t(hd)).width);
  }
  void decode_row(KvPart part, const uint8_t* hb, int hd, int bt, int t, float* dst) const override {
    if (part == KvPart::key) return detail::q8_decode_key_row(hb, false, size_t(hd), size_t(bt), size_t(t), dst);
    const float scale = scale_at(hb, size_t(t));
    const auto* data = reinterpret_cast<const int8_t*>(hb + detail::q8_data_offset(size_t(bt)));
    for (size_t i = 0; i < size_t(hd); ++i) dst[i] = static_cast<float>(data[detail::q8_value_index(size_t(t), i, size_t(hd), size_t(bt))]) * scale;
  }
  // Keys [bt][hd] <-> groups of [hd/2][32][2].
  void seal(KvPart part, uint8_t* hb, int hd, int bt, uint8_t* scratch) const override {
    if (part == KvPart::key && detail::q8_seals_keys(size_t(hd))) relayout_keys(hb, size_t(hd), size_t(bt), scratch, true);
  }
  void unseal(KvPart part, uint8_t* hb, int hd, int bt, uint8_t* scratch) const override {
    if (part == KvPart::key && detail::q8_seals_keys(size_t(hd))) relayout_keys(hb, size_t(hd), size_t(bt), scratch, false);
  }

 private:
  // Element pairs are the transposed 16-bit elements.
  static void relayout_keys(uint8_t* hb, size_t hd, size_t bt, uint8_t* scratch, bool seal) {
    relayout_key_groups(hb + detail::q8_data_offset(bt), hd / 2, bt, kQ8KeyGroup, scratch, seal);
  }
};

class Q4Format final : public QuantFormatBase {
 public:
  KvDtype dtype() const override { return KvDtype::q4; }
  const char* name() const override { return "int4"; }
  bool supports(int hd) const override { return hd > 0 && hd <= kMaxHeadDim && hd % 32 == 0; }
  std::string head_dims() const override {
    return "head_dim in multiples of 32 up to " + std::to_string(kMaxHeadDim);
  }
  size_t head_block_bytes(int bt, int hd) const override {
    // Keys are padded to whole key groups, values only to quads.
    const size_t data = round_up(size_t(bt), kQ4KeyGroup) * size_t(hd) / 2;
    return round_up(detail::q4_data_offset(size_t(bt), size_t(hd) / 32) + data, 64);
  }
  void encode_row(KvPart part, const uint16_t* src, int hd, int bt, int t, uint8_t* hb) const override {
    const size_t groups = size_t(hd) / 32;
    uint8_t bytes[kMaxHeadDim / 2];
    uint16_t scales[kMaxHeadDim / 32];
    quantize_row_q4(src, size_t(hd), bytes, scales);
    uint8_t* data = hb + detail::q4_data_offset(size_t(bt), groups);
    if (part == KvPart::key) {
      for (size_t c = 0; c < groups * 16; c += 4) std::memcpy(data + index(part, hd, t, c), bytes + c, 4);
    } else {
      uint8_t* row = data + index(part, hd, t, 0);  // every 4th byte
      for (size_t i = 0; i < groups * 16; ++i) row[4 * i] = bytes[i];
    }
    for (size_t g = 0; g < groups; ++g)
      std::memcpy(hb + detail::q4_scale_index(size_t(t), g, groups) * sizeof(uint16_t), &scales[g], sizeof(uint16_t));
  }
  void prefetch_row(KvPart part, int hd, int bt, int t, const uint8_t* hb) const override {
    const size_t groups = size_t(hd) / 32;
    // The row's scales lie kQ4ScaleRows apart, and its key bytes a line apart (4 per line).
    fetch_for_write(hb + detail::q4_scale_index(size_t(t), 0, groups) * sizeof(uint16_t),
                    ((groups - 1) * kQ4ScaleRows + 1) * sizeof(uint16_t));
    const uint8_t* data = hb + detail::q4_data_offset(size_t(bt), groups);
    if (part == KvPart::value) return fetch_for_write(data + index(part, hd, t, 0) - size_t(t) % 4, 4 * groups * 16);
    const uint8_t* key = data + index(part, hd, t, 0);
    for (size_t line = 0; line < groups * 4; ++line) __builtin_prefetch(key + line * kQ4KeyGroup * 4, 1, 3);
  }
  void decode_row(KvPart part, const uint8_t* hb, int hd, int bt, int t, float* dst) const override {
    const size_t groups = size_t(hd) / 32;
    const uint8_t* data = hb + detail::q4_data_offset(size_t(bt), groups);
    for (size_t g = 0; g < groups; ++g) {
      const float scale = scale_at(hb, detail::q4_scale_index(size_t(t), g, groups));
      for (size_t j = 0; j < 16; ++j) {
        const uint8_t b = data[index(part, hd, t, g * 16 + j)];
        dst[g * 32 + j] = static_cast<float>((b & 15) - 8) * scale;
        dst[g * 32 + 16 + j] = static_cast<float>((b >> 4) - 8) * scale;
      }
    }
  }

 private:
  // Where byte c of row t lies in the data.
  static size_t index(KvPart part, int hd, int t, size_t c) {
    if (part == KvPart::key) return detail::q4_key_index(size_t(t), c, size_t(hd));
    return detail::q4_value_index(size_t(t), c / 16, c % 16, size_t(hd) / 32);
  }
};

}  // namespace

void detail::q8_decode_key_row(const uint8_t* hb, bool sealed, size_t hd, size_t bt, size_t t, float* dst) {
  const float scale = scale_at(hb, t);
  const auto* data = reinterpret_cast<const int8_t*>(hb + q8_data_offset(bt));
  for (size_t i = 0; i < hd; ++i) dst[i] = static_cast<float>(data[q8_key_index(sealed, t, i, hd, bt)]) * scale;
}

const KvFormat& kv_format(KvDtype dtype) {
  static const F16Format f16;
  static const Q8Format q8;
  static const Q4Format q4;
  switch (dtype) {
    case KvDtype::q8: return q8;
    case KvDtype::q4: return q4;
    case KvDtype::f16: break;
  }
  return f16;
}

const char* kv_dtype_name(KvDtype dtype) { return kv_format(dtype).name(); }

namespace {

// The short name of a quantized format, also accepted; null for f16.
const char* kv_dtype_alias(KvDtype dtype) {
  return dtype == KvDtype::q8 ? "q8" : dtype == KvDtype::q4 ? "q4" : nullptr;
}

}  // namespace

std::string kv_dtype_label(KvDtype dtype) {
  const char* alias = kv_dtype_alias(dtype);
  return alias ? std::string(kv_dtype_name(dtype)) + " (" + alias + ")" : kv_dtype_name(dtype);
}

bool parse_kv_dtype(const std::string& s, KvDtype* dtype) {
  for (KvDtype d : kKvDtypes) {
    const char* alias = kv_dtype_alias(d);
    if (s == kv_dtype_name(d) || (alias && s == alias)) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

const char* kv_layout_name(KvLayout layout) { return layout == KvLayout::kSideBySide ? "side" : "apart"; }

bool parse_kv_layout(const std::string& s, KvLayout* layout) {
  for (KvLayout l : {KvLayout::kApart, KvLayout::kSideBySide})
    if (s == kv_layout_name(l)) {
      *layout = l;
      return true;
    }
  return false;
}

}  // namespace fd::kernels
