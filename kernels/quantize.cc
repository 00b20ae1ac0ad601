#include "kernels/quantize.h"

#include <cstring>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quantize.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "kernels/f16-inl.h"

#ifndef FD_KERNELS_QUANTIZE_ONCE_
#define FD_KERNELS_QUANTIZE_ONCE_
namespace fd::kernels {
namespace {
constexpr size_t kMaxRow = 256;  // elements: the formats' largest head_dim
}  // namespace
}  // namespace fd::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace fd::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;  // at most 16 lanes, so that a q4 group holds whole vectors

// x [n] as fp32 into xf, zero-padded to a whole number of vectors (zeros change no maximum).
HWY_INLINE size_t LoadRow(DF df, const uint16_t* x, size_t n, float* xf) {
  const size_t L = hn::Lanes(df);
  size_t i = 0;
  for (; i + L <= n; i += L) hn::Store(LoadF16(df, x + i), df, xf + i);
  if (i < n) {
    HWY_ALIGN uint16_t tail[hn::MaxLanes(DF())] = {};
    std::memcpy(tail, x + i, (n - i) * sizeof(uint16_t));
    hn::Store(LoadF16(df, tail), df, xf + i);
    i += L;
  }
  return i;
}

// The bits of the largest |x| over xf [n] (n a multiple of Lanes): the bits of |x| order as its
// values do, and a NaN's or an infinity's (0x7F800000 and up) are the largest.
HWY_INLINE int32_t MaxAbsBits(DF df, const float* xf, size_t n) {
  const hn::RebindToSigned<DF> di;
  auto top = hn::Zero(di);
  for (size_t i = 0; i < n; i += hn::Lanes(df))
    top = hn::Max(top, hn::And(hn::BitCast(di, hn::Load(df, xf + i)), hn::Set(di, 0x7FFFFFFF)));
  return hn::GetLane(hn::MaxOfLanes(di, top));
}

// The largest |x| over xf [n] (n a multiple of Lanes), or NaN when one is a NaN or an infinity.
HWY_INLINE float MaxAbsOrNaN(DF df, const float* xf, size_t n) {
  const int32_t bits = MaxAbsBits(df, xf, n);
  if (bits >= 0x7F800000) return std::numeric_limits<float>::quiet_NaN();
  float amax;
  std::memcpy(&amax, &bits, sizeof amax);
  return amax;
}

// round(x * inv), ties to even, clamped to [-levels, levels].
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> RoundScaled(DF df, hn::Vec<DF> x, float inv, int32_t levels) {
  const hn::RebindToSigned<DF> di;
  const auto r = hn::NearestInt(hn::Mul(x, hn::Set(df, inv)));
  return hn::Min(hn::Max(r, hn::Set(di, -levels)), hn::Set(di, levels));
}

uint16_t QuantizeRowQ8Impl(const uint16_t* x, size_t n, int8_t* q) {
  const DF df;
  const hn::Rebind<int8_t, DF> d8;
  const size_t L = hn::Lanes(df);
  HWY_ALIGN float xf[kMaxRow + hn::MaxLanes(DF())];
  const size_t padded = LoadRow(df, x, n, xf);
  // The stored scale is the grid: fp32 -> fp16 -> fp32, as decoding reads it.
  const hn::CappedTag<float, 1> d1;
  HWY_ALIGN uint16_t half[hn::MaxLanes(d1)];
  StoreF16(d1, hn::Set(d1, MaxAbsOrNaN(df, xf, padded) / 127.0f), half);
  const float scale = hn::GetLane(LoadF16(d1, half));
  if (scale != scale) {
    std::memset(q, 0, n);
    return half[0];
  }
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  // Whole vectors go straight to q and only the tail through a buffer. Copied out of one whole,
  // the row's 32-byte loads of the 8-byte stores just made stalled (store forwarding): the
  // quantizer took 46 % of appending q8 rows (hd128).
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::DemoteTo(d8, RoundScaled(df, hn::Load(df, xf + i), inv, 127)), d8, q + i);
  if (i < n) {
    HWY_ALIGN int8_t tail[hn::MaxLanes(DF())];
    hn::Store(hn::DemoteTo(d8, RoundScaled(df, hn::Load(df, xf + i), inv, 127)), d8, tail);
    std::memcpy(q + i, tail, n - i);
  }
  return half[0];
}

void QuantizeRowQ4Impl(const uint16_t* x, size_t n, uint8_t* bytes, uint16_t* scales) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  const size_t L = hn::Lanes(df);
  HWY_ALIGN float xf[kMaxRow + hn::MaxLanes(DF())];
  LoadRow(df, x, n, xf);
  const size_t groups = n / 32;
  // Every group's scale first, a vector of groups at a time: with one group's chain of maximum,
  // division, fp16 round trip and inverse after another, an hd128 row took 1.28x as long (AMD
  // EPYC Zen 3, one core, rows in cache; hd64 the same).
  HWY_ALIGN float inv[kMaxRow / 32 + hn::MaxLanes(DF())];
  HWY_ALIGN uint16_t half[kMaxRow / 32 + hn::MaxLanes(DF())];
  for (size_t g = 0; g < groups; g += L) {
    // The maxima of groups [g, g + L) in the lanes of one register: stored one by one and loaded
    // as a vector, the load waited for the stores to retire (no store forwarding), where 36 % of
    // this quantizer's samples fell as fastdecode-bench appended q4 rows.
    auto bits = hn::Zero(di);
    for (size_t i = 0; i < L && g + i < groups; ++i) {
      const auto top = hn::Set(di, MaxAbsBits(df, xf + 32 * (g + i), 32));
      bits = hn::IfThenElse(hn::Eq(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(i))), top, bits);
    }
    const auto bad = hn::RebindMask(df, hn::Gt(bits, hn::Set(di, 0x7F7FFFFF)));  // a NaN or an infinity
    const auto amax = hn::IfThenElse(bad, hn::Set(df, std::numeric_limits<float>::quiet_NaN()), hn::BitCast(df, bits));
    StoreF16(df, hn::Div(amax, hn::Set(df, 7.0f)), half + g);
    // The stored scale is the grid: fp32 -> fp16 -> fp32, as decoding reads it.
    const auto scale = LoadF16(df, half + g);
    // 0 for a zero or an infinite scale's group (nibbles 8); NaN for a NaN's.
    const auto r = hn::IfThenElseZero(hn::Gt(scale, hn::Zero(df)), hn::Div(hn::Set(df, 1.0f), scale));
    hn::Store(hn::IfThenElse(hn::IsNaN(scale), scale, r), df, inv + g);
  }
  std::memcpy(scales, half, groups * sizeof(uint16_t));
  for (size_t g = 0; g < groups; ++g) {
    const float* xg = xf + 32 * g;
    if (inv[g] != inv[g]) {
      std::memset(bytes + 16 * g, 0x88, 16);
      continue;
    }
    for (size_t j = 0; j < 16; j += L) {
      const auto lo = hn::Add(RoundScaled(df, hn::Load(df, xg + j), inv[g], 7), hn::Set(di, 8));
      const auto hi = hn::Add(RoundScaled(df, hn::Load(df, xg + 16 + j), inv[g], 7), hn::Set(di, 8));
      hn::StoreU(hn::DemoteTo(d8, hn::Or(lo, hn::ShiftLeft<4>(hi))), d8, bytes + 16 * g + j);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace fd::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fd::kernels {

HWY_EXPORT(QuantizeRowQ8Impl);
HWY_EXPORT(QuantizeRowQ4Impl);

uint16_t quantize_row_q8(const uint16_t* x, size_t n, int8_t* q) {
  return HWY_DYNAMIC_DISPATCH(QuantizeRowQ8Impl)(x, n, q);
}

void quantize_row_q4(const uint16_t* x, size_t n, uint8_t* bytes, uint16_t* scales) {
  HWY_DYNAMIC_DISPATCH(QuantizeRowQ4Impl)(x, n, bytes, scales);
}

}  // namespace fd::kernels
#endif  // HWY_ONCE
