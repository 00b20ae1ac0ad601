#include "kernels/kv_format.h"

#include <algorithm>
#include <cstring>

#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "kernels/stream.h"

namespace fd::kernels {
namespace {

constexpr int kMaxHeadDim = 256;  // attention keeps a head's accumulators on the stack

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void store_f32(uint8_t* p, float v) { std::memcpy(p, &v, sizeof v); }

// Moves a head block's `bytes` of data at `data` between the row layout and the sealed one, by way
// of scratch: each(move) calls move(at_rows, at_sealed, n) for every run of n bytes, with its
// offsets in either layout.
template <class Each>
void relayout(uint8_t* data, size_t bytes, uint8_t* scratch, bool seal, const Each& each) {
  std::memcpy(scratch, data, bytes);
  each([&](size_t at_rows, size_t at_sealed, size_t n) {
    std::memcpy(data + (seal ? at_sealed : at_rows), scratch + (seal ? at_rows : at_sealed), n);
  });
}
float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

class KvFormatBase : public KvFormat {
 public:
  void attend(const float* q, int n_q, int q_pos0, const KvBlocks& kv, const AttnDims& d,
              int kvh_begin, int kvh_end, float* out) const override {
    detail::attend_heads(q, n_q, q_pos0, kv, head_block_bytes(kv.block_tokens, d.head_dim), d,
                         kvh_begin, kvh_end, out);
  }
};

class QuantFormatBase : public KvFormat {
 public:
  void attend(const float* q, int n_q, int q_pos0, const KvBlocks& kv, const AttnDims& d,
              int kvh_begin, int kvh_end, float* out) const override {
    detail::attend_quant_heads(q, n_q, q_pos0, kv, head_block_bytes(kv.block_tokens, d.head_dim), d,
                               kvh_begin, kvh_end, out);
  }
};

class F16Format final : public KvFormatBase {
 public:
  KvDtype dtype() const override { return KvDtype::f16; }
  const char* name() const override { return "f16"; }
  bool supports(int hd) const override { return hd > 0 && hd <= kMaxHeadDim; }
  size_t head_block_bytes(int bt, int hd) const override {
    return size_t(bt) * size_t(hd) * sizeof(uint16_t);
  }
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
  // Keys move element by element, values a chunk row (up to 16 elements) at a time.
  static void relayout_f16(KvPart part, uint8_t* hb, size_t hd, size_t bt, uint8_t* scratch, bool seal) {
    constexpr size_t e = sizeof(uint16_t);
    relayout(hb, bt * hd * e, scratch, seal, [&](const auto& move) {
      if (part == KvPart::key) {
        for (size_t t = 0; t < bt; ++t)
          for (size_t i = 0; i < hd; ++i) move((t * hd + i) * e, detail::f16_sealed_key_index(t, i, hd, bt) * e, e);
        return;
      }
      for (size_t c0 = 0; c0 < hd; c0 += kF16ValueChunk)
        for (size_t t = 0; t < bt; ++t)
          move((t * hd + c0) * e, detail::f16_sealed_value_index(t, c0, hd, bt) * e,
               detail::run_of(c0, kF16ValueChunk, hd).width * e);
    });
  }
};

class Q8Format final : public QuantFormatBase {
 public:
  KvDtype dtype() const override { return KvDtype::q8; }
  const char* name() const override { return "q8"; }
  bool supports(int hd) const override { return hd > 0 && hd <= kMaxHeadDim; }
  size_t head_block_bytes(int bt, int hd) const override {
    return round_up(size_t(bt) * sizeof(float) + round_up(size_t(bt), 4) * size_t(hd), 64);
  }
  void encode_row(KvPart part, const uint16_t* src, int hd, int bt, int t, uint8_t* hb) const override {
    int8_t q[kMaxHeadDim];
    const float scale = quantize_row_q8(src, size_t(hd), q);
    auto* data = reinterpret_cast<int8_t*>(hb + size_t(bt) * sizeof(float));
    if (part == KvPart::key) {
      std::memcpy(data + detail::q8_key_index(false, size_t(t), 0, size_t(hd), size_t(bt)), q, size_t(hd));
    } else {
      for (size_t c0 = 0; c0 < size_t(hd); c0 += kQ8ValueChunk) {
        int8_t* row = data + detail::q8_value_index(size_t(t), c0, size_t(hd), size_t(bt));  // every 4th byte
        const size_t width = detail::run_of(c0, kQ8ValueChunk, size_t(hd)).width;
        for (size_t i = 0; i < width; ++i) row[4 * i] = q[c0 + i];
      }
    }
    store_f32(hb + size_t(t) * sizeof(float), scale);
  }
  void decode_row(KvPart part, const uint8_t* hb, int hd, int bt, int t, float* dst) const override {
    if (part == KvPart::key) return detail::q8_decode_key_row(hb, false, size_t(hd), size_t(bt), size_t(t), dst);
    const float scale = load_f32(hb + size_t(t) * sizeof(float));
    const auto* data = reinterpret_cast<const int8_t*>(hb + size_t(bt) * sizeof(float));
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
  static void relayout_keys(uint8_t* hb, size_t hd, size_t bt, uint8_t* scratch, bool seal) {
    relayout(hb + bt * sizeof(float), bt * hd, scratch, seal, [&](const auto& move) {
      for (size_t t = 0; t < bt; ++t)
        for (size_t i = 0; i < hd; i += 2)
          move(detail::q8_key_index(false, t, i, hd, bt), detail::q8_key_index(true, t, i, hd, bt), 2);
    });
  }
};

class Q4Format final : public QuantFormatBase {
 public:
  KvDtype dtype() const override { return KvDtype::q4; }
  const char* name() const override { return "q4"; }
  bool supports(int hd) const override { return hd > 0 && hd <= kMaxHeadDim && hd % 32 == 0; }
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
  void decode_row(KvPart part, const uint8_t* hb, int hd, int bt, int t, float* dst) const override {
    const size_t groups = size_t(hd) / 32;
    const uint8_t* data = hb + detail::q4_data_offset(size_t(bt), groups);
    for (size_t g = 0; g < groups; ++g) {
      uint16_t half;
      std::memcpy(&half, hb + detail::q4_scale_index(size_t(t), g, groups) * sizeof(uint16_t), sizeof half);
      float scale;
      f16_to_f32(&half, &scale, 1);
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
  const float scale = load_f32(hb + t * sizeof(float));
  const auto* data = reinterpret_cast<const int8_t*>(hb + bt * sizeof(float));
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

bool parse_kv_dtype(const std::string& s, KvDtype* dtype) {
  for (KvDtype d : {KvDtype::f16, KvDtype::q8, KvDtype::q4})
    if (s == kv_dtype_name(d)) {
      *dtype = d;
      return true;
    }
  return false;
}

}  // namespace fd::kernels
