#include "kernels/stream.h"

#include <cstdint>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/stream.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace fd::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

double SumF32Impl(const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    a0 = hn::Add(a0, hn::LoadU(d, x + i));
    a1 = hn::Add(a1, hn::LoadU(d, x + i + L));
    a2 = hn::Add(a2, hn::LoadU(d, x + i + 2 * L));
    a3 = hn::Add(a3, hn::LoadU(d, x + i + 3 * L));
  }
  double sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) sum += x[i];
  return sum;
}

void CopyStreamingImpl(void* HWY_RESTRICT dst, const void* HWY_RESTRICT src, size_t bytes) {
  const hn::ScalableTag<uint8_t> d;
  const size_t L = hn::Lanes(d);
  if (reinterpret_cast<uintptr_t>(dst) % L != 0 || bytes % L != 0) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < bytes; i += L) hn::Stream(hn::LoadU(d, in + i), d, out + i);
}

}  // namespace HWY_NAMESPACE
}  // namespace fd::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fd::kernels {

HWY_EXPORT(SumF32Impl);

HWY_EXPORT(CopyStreamingImpl);

double sum_f32(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(SumF32Impl)(x, n); }

void copy_streaming(void* dst, const void* src, size_t bytes) {
  HWY_DYNAMIC_DISPATCH(CopyStreamingImpl)(dst, src, bytes);
}

void streaming_fence() { hwy::FlushStream(); }

}  // namespace fd::kernels
#endif  // HWY_ONCE
