#include "kernels/ops.h"

#include <cblas.h>

#include <cmath>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/ops.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "kernels/elementwise.h"
#include "kernels/f16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fd::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A partial last vector goes through a zero-padded buffer so every element takes the same path.
void F32ToF16Impl(const float* HWY_RESTRICT x, uint16_t* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t L = hn::Lanes(df);
  size_t i = 0;
  for (; i + L <= n; i += L) StoreF16(df, hn::LoadU(df, x + i), y + i);
  if (i < n) {
    HWY_ALIGN float in[hn::MaxLanes(df)] = {};
    HWY_ALIGN uint16_t out[hn::MaxLanes(df)];
    for (size_t j = i; j < n; ++j) in[j - i] = x[j];
    StoreF16(df, hn::Load(df, in), out);
    for (size_t j = i; j < n; ++j) y[j] = out[j - i];
  }
}

void F16ToF32Impl(const uint16_t* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t L = hn::Lanes(df);
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(LoadF16(df, x + i), df, y + i);
  if (i < n) {
    HWY_ALIGN uint16_t in[hn::MaxLanes(df)] = {};
    HWY_ALIGN float out[hn::MaxLanes(df)];
    for (size_t j = i; j < n; ++j) in[j - i] = x[j];
    hn::Store(LoadF16(df, in), df, out);
    for (size_t j = i; j < n; ++j) y[j] = out[j - i];
  }
}

void SwigluImpl(const float* gate, const float* up, float* out, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t L = hn::Lanes(df);
  const auto one = hn::Set(df, 1.0f);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto g = hn::LoadU(df, gate + i);
    const auto silu = hn::Div(g, hn::Add(one, hn::Exp(df, hn::Neg(g))));
    hn::StoreU(hn::Mul(silu, hn::LoadU(df, up + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = swiglu_one(gate[i], up[i]);
}

void AddInplaceImpl(float* HWY_RESTRICT y, const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t L = hn::Lanes(df);
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Add(hn::LoadU(df, y + i), hn::LoadU(df, x + i)), df, y + i);
  for (; i < n; ++i) y[i] += x[i];
}

void RmsnormImpl(const float* x, const float* w, float* y, int rows, int dim, float eps) {
  const hn::ScalableTag<float> df;
  const size_t L = hn::Lanes(df);
  const size_t n = static_cast<size_t>(dim);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * n;
    float* yr = y + static_cast<size_t>(r) * n;
    auto acc = hn::Zero(df);
    size_t i = 0;
    for (; i + L <= n; i += L) {
      const auto v = hn::LoadU(df, xr + i);
      acc = hn::MulAdd(v, v, acc);
    }
    double sum = hn::GetLane(hn::SumOfLanes(df, acc));
    for (; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float scale = rmsnorm_scale(static_cast<float>(sum / dim), eps);
    const auto vs = hn::Set(df, scale);
    i = 0;
    for (; i + L <= n; i += L)
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, xr + i), vs), hn::LoadU(df, w + i)), df, yr + i);
    for (; i < n; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace fd::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fd::kernels {

HWY_EXPORT(F32ToF16Impl);
HWY_EXPORT(F16ToF32Impl);
HWY_EXPORT(SwigluImpl);
HWY_EXPORT(AddInplaceImpl);
HWY_EXPORT(RmsnormImpl);

void matmul_nt(const float* x, const float* w, float* y, int m, int n, int k) {
  // OpenBLAS 0.3.21 runs a one-row sgemm 4-7x slower than sgemv (measured), and m == 1 is
  // batch-1 decode.
  if (m == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, 0.0f, y, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
}

void set_gemm_threads(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
}

void rmsnorm(const float* x, const float* w, float* y, int rows, int dim, float eps) {
  HWY_DYNAMIC_DISPATCH(RmsnormImpl)(x, w, y, rows, dim, eps);
}

// Matches llama.cpp: theta_scale = base^(-2/head_dim) and theta_i = pos * theta_scale^i, built by
// repeated fp32 multiplication; the table is shared by every head of a row.
void rope(float* x, const int32_t* pos, int rows, int n_heads, int head_dim, float base) {
  const int half = head_dim / 2;
  const float theta_scale = rope_theta_scale(base, head_dim);
  std::vector<float> cs(static_cast<size_t>(head_dim));  // [half][cos, sin]
  for (int r = 0; r < rows; ++r) {
    float theta = static_cast<float>(pos[r]);
    for (int i = 0; i < half; ++i) {
      cs[2 * i] = std::cos(theta);
      cs[2 * i + 1] = std::sin(theta);
      theta *= theta_scale;
    }
    float* xr = x + static_cast<size_t>(r) * n_heads * head_dim;
    for (int h = 0; h < n_heads; ++h) {
      float* xh = xr + static_cast<size_t>(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        rope_rotate(xh[2 * i], xh[2 * i + 1], cs[2 * i], cs[2 * i + 1]);
      }
    }
  }
}

void swiglu(const float* gate, const float* up, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluImpl)(gate, up, out, n);
}

void add_inplace(float* y, const float* x, size_t n) {
  HWY_DYNAMIC_DISPATCH(AddInplaceImpl)(y, x, n);
}

void f32_to_f16(const float* x, uint16_t* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToF16Impl)(x, y, n);
}

void f16_to_f32(const uint16_t* x, float* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(F16ToF32Impl)(x, y, n);
}

}  // namespace fd::kernels
#endif  // HWY_ONCE
