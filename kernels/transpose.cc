#include "kernels/transpose.h"

#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/transpose.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace fd::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One element; memcpy, since callers' buffers may be bytes.
HWY_INLINE void CopyElement(const uint16_t* src, uint16_t* dst) { std::memcpy(dst, src, sizeof(uint16_t)); }

#if HWY_TARGET != HWY_SCALAR
// The 8x8 block at src (row stride ss) into dst (row stride ds): three rounds of interleaves, of
// 16-, 32- and 64-bit lanes. A seal moved one element per load and store before: sealing was 48 %
// of appending f16 rows (hd128) and 15 % of q8's.
HWY_INLINE void Transpose8x8(const uint16_t* src, size_t ss, uint16_t* dst, size_t ds) {
  const hn::Full128<uint16_t> d16;
  const hn::Full128<uint32_t> d32;
  const hn::Full128<uint64_t> d64;
  hn::Vec<decltype(d16)> a[8];
  for (size_t r = 0; r < 8; ++r) a[r] = hn::LoadU(d16, src + r * ss);
  hn::Vec<decltype(d32)> b[8];  // b[2k], b[2k+1]: rows 2k and 2k+1 paired, columns 0-3 and 4-7
  for (size_t k = 0; k < 4; ++k) {
    b[2 * k] = hn::BitCast(d32, hn::InterleaveLower(d16, a[2 * k], a[2 * k + 1]));
    b[2 * k + 1] = hn::BitCast(d32, hn::InterleaveUpper(d16, a[2 * k], a[2 * k + 1]));
  }
  hn::Vec<decltype(d64)> c[8];  // c[4h + j]: rows 4h..4h+3 of columns 2j and 2j+1
  for (size_t h = 0; h < 2; ++h)
    for (size_t j = 0; j < 2; ++j) {
      const auto lo = b[4 * h + j], hi = b[4 * h + 2 + j];
      c[4 * h + 2 * j] = hn::BitCast(d64, hn::InterleaveLower(d32, lo, hi));
      c[4 * h + 2 * j + 1] = hn::BitCast(d64, hn::InterleaveUpper(d32, lo, hi));
    }
  for (size_t j = 0; j < 4; ++j) {
    hn::StoreU(hn::BitCast(d16, hn::InterleaveLower(d64, c[j], c[4 + j])), d16, dst + (2 * j) * ds);
    hn::StoreU(hn::BitCast(d16, hn::InterleaveUpper(d64, c[j], c[4 + j])), d16, dst + (2 * j + 1) * ds);
  }
}
#endif

void TransposeU16Impl(const uint16_t* HWY_RESTRICT src, size_t rows, size_t cols, size_t ss,
                      uint16_t* HWY_RESTRICT dst, size_t ds) {
  size_t r8 = 0, c8 = 0;  // rows and columns covered by whole 8x8 blocks
#if HWY_TARGET != HWY_SCALAR
  r8 = rows / 8 * 8;
  c8 = cols / 8 * 8;
  for (size_t r = 0; r < r8; r += 8)
    for (size_t c = 0; c < c8; c += 8) Transpose8x8(src + r * ss + c, ss, dst + c * ds + r, ds);
#endif
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = r < r8 ? c8 : 0; c < cols; ++c) CopyElement(src + r * ss + c, dst + c * ds + r);
}

}  // namespace HWY_NAMESPACE
}  // namespace fd::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fd::kernels {

HWY_EXPORT(TransposeU16Impl);

void transpose_u16(const uint16_t* src, size_t rows, size_t cols, size_t src_stride, uint16_t* dst,
                   size_t dst_stride) {
  HWY_DYNAMIC_DISPATCH(TransposeU16Impl)(src, rows, cols, src_stride, dst, dst_stride);
}

}  // namespace fd::kernels
#endif  // HWY_ONCE
