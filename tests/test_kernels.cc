#include <catch2/catch.hpp>

#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "kernels/stream.h"
#include "kernels/transpose.h"
#include "tests/simd_targets.h"

namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24: unit roundoff of fp32

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Scalar references built from the arithmetic definition of binary16, not from bit tricks.
// NaNs follow the x86 F16C convention: quieted, payload kept (its top bits when narrowing).
uint32_t ref_f16_to_f32_bits(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const int e = (h >> 10) & 31, m = h & 0x3FF;
  if (e == 31) return sign | 0x7F800000u | (m ? 0x400000u | (uint32_t(m) << 13) : 0u);
  const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(1024 + m), e - 25);
  return sign | bits_of(static_cast<float>(mag));
}

uint16_t ref_f32_to_f16(float f) {
  const uint16_t sign = static_cast<uint16_t>((bits_of(f) >> 31) << 15);
  if (std::isnan(f)) return sign | 0x7E00 | ((bits_of(f) >> 13) & 0x3FF);
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;  // 65520 is halfway from 65504 to 2^16: ties to even
  if (a < std::ldexp(1.0, -14)) {
    const double r = std::nearbyint(a * 16777216.0);  // units of 2^-24; 1024 is the smallest normal
    return sign | static_cast<uint16_t>(r);
  }
  int ex;
  std::frexp(a, &ex);
  int e = ex - 1;  // a in [2^e, 2^(e+1))
  double r = std::nearbyint(std::ldexp(a, 10 - e));
  if (r == 2048.0) {
    r = 1024.0;
    ++e;
  }
  return sign | static_cast<uint16_t>(((e + 15) << 10) | (static_cast<int>(r) - 1024));
}

// Runs body once per Highway target compiled into the library and supported by this CPU.
template <class F>
void for_each_target(F body) {
  for_each_simd_target([&](int64_t target) {
    INFO("target " << hwy::TargetName(target));
    body();
  });
}

std::vector<float> random_floats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace

TEST_CASE("f16_to_f32 matches the reference on all 65536 values", "[kernels]") {
  std::vector<uint16_t> h(65536);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  for_each_target([&] {
    std::vector<float> f(h.size());
    fd::kernels::f16_to_f32(h.data(), f.data(), h.size());
    size_t bad = 0;
    for (size_t i = 0; i < h.size(); ++i) bad += bits_of(f[i]) != ref_f16_to_f32_bits(h[i]);
    CHECK(bad == 0);
    // Short lengths take the partial-vector path.
    for (size_t n = 1; n < 40; ++n) {
      std::vector<float> g(n, -1.0f);
      fd::kernels::f16_to_f32(h.data() + 0x3BF0, g.data(), n);
      for (size_t i = 0; i < n; ++i) CHECK(bits_of(g[i]) == ref_f16_to_f32_bits(h[0x3BF0 + i]));
    }
  });
}

TEST_CASE("f32_to_f16 rounds to nearest even with subnormals, infinities and NaNs", "[kernels]") {
  std::vector<float> x;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t b = ref_f16_to_f32_bits(static_cast<uint16_t>(h));
    x.push_back(float_of(b));
    if ((h & 0x7C00) == 0x7C00) continue;
    // Around the midpoint to the next f16 magnitude: exact ties and one fp32 ulp either side.
    const double lo = std::fabs(static_cast<double>(float_of(b)));
    const double next = (h & 0x7FFF) == 0x7BFF ? 65536.0
                                                 : std::fabs(static_cast<double>(float_of(
                                                       ref_f16_to_f32_bits(static_cast<uint16_t>(h + 1)))));
    const float mid = static_cast<float>((lo + next) / 2) * ((h & 0x8000) ? -1.0f : 1.0f);
    x.push_back(mid);
    x.push_back(std::nextafter(mid, 0.0f));
    x.push_back(std::nextafter(mid, mid * 2));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < (1 << 20); ++i) x.push_back(float_of(static_cast<uint32_t>(rng())));
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, 1e30f, -1e-30f,
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), float_of(0x7F800001u), float_of(0xFFA00001u),
                  std::numeric_limits<float>::quiet_NaN()})
    x.push_back(f);

  for_each_target([&] {
    std::vector<uint16_t> y(x.size());
    fd::kernels::f32_to_f16(x.data(), y.data(), x.size());
    size_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (y[i] != ref_f32_to_f16(x[i]) && bad++ < 5)
        FAIL_CHECK("f32 bits " << std::hex << bits_of(x[i]) << " -> " << y[i] << ", expected "
                               << ref_f32_to_f16(x[i]));
    }
    CHECK(bad == 0);
    for (size_t n = 1; n < 40; ++n) {
      std::vector<uint16_t> z(n + 1, 0xABCD);
      fd::kernels::f32_to_f16(x.data() + 1000, z.data(), n);
      for (size_t i = 0; i < n; ++i) CHECK(z[i] == ref_f32_to_f16(x[1000 + i]));
      CHECK(z[n] == 0xABCD);
    }
  });
}

TEST_CASE("matmul_nt computes x times w transposed", "[kernels]") {
  for (auto [m, n, k] : {std::tuple{1, 1, 1}, {3, 5, 7}, {17, 33, 64}, {64, 96, 257}}) {
    const auto x = random_floats(size_t(m) * k, -1, 1, 1);
    const auto w = random_floats(size_t(n) * k, -1, 1, 2);
    std::vector<float> y(size_t(m) * n);
    fd::kernels::matmul_nt(x.data(), w.data(), y.data(), m, n, k);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double ref = 0, mag = 0;
        for (int p = 0; p < k; ++p) {
          ref += double(x[size_t(i) * k + p]) * w[size_t(j) * k + p];
          mag += std::fabs(double(x[size_t(i) * k + p]) * w[size_t(j) * k + p]);
        }
        // fp32 dot product of k terms: |error| <= k u sum|x w| (any summation order).
        CHECK(std::fabs(y[size_t(i) * n + j] - ref) <= k * kU * mag + 1e-30);
      }
  }
}

TEST_CASE("rmsnorm scales rows to unit rms times the weight", "[kernels]") {
  for (int dim : {1, 8, 63, 64, 288, 1000}) {
    const int rows = 3;
    auto x = random_floats(size_t(rows) * dim, -4, 4, 3);
    const auto w = random_floats(size_t(dim), 0.5, 1.5, 4);
    const float eps = 1e-5f;
    std::vector<float> y(x.size());
    fd::kernels::rmsnorm(x.data(), w.data(), y.data(), rows, dim, eps);
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double(x[size_t(r) * dim + i]) * x[size_t(r) * dim + i];
      const double scale = 1.0 / std::sqrt(ss / dim + eps);
      for (int i = 0; i < dim; ++i) {
        const double ref = x[size_t(r) * dim + i] * scale * w[i];
        // fp32 sum of squares: rel. error <= dim u, halved by the sqrt; plus 4 roundings.
        CHECK(std::fabs(y[size_t(r) * dim + i] - ref) <= (dim / 2.0 + 4) * kU * std::fabs(ref) + 1e-30);
      }
    }
    std::vector<float> z = x;  // in place
    fd::kernels::rmsnorm(z.data(), w.data(), z.data(), rows, dim, eps);
    CHECK(z == y);
  }
}

TEST_CASE("rope rotates adjacent pairs by pos * base^(-2i/head_dim)", "[kernels]") {
  for (int head_dim : {8, 64, 128}) {
    const int rows = 4, n_heads = 3;
    const float base = 10000.0f;
    const std::vector<int32_t> pos = {0, 1, 37, 4095};
    const auto x0 = random_floats(size_t(rows) * n_heads * head_dim, -2, 2, 5);
    auto x = x0;
    fd::kernels::rope(x.data(), pos.data(), rows, n_heads, head_dim, base);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < n_heads; ++h)
        for (int i = 0; i < head_dim / 2; ++i) {
          const size_t o = (size_t(r) * n_heads + h) * head_dim + 2 * i;
          const double theta = pos[r] * std::pow(double(base), -2.0 * i / head_dim);
          const double a = x0[o], b = x0[o + 1];
          const double ra = a * std::cos(theta) - b * std::sin(theta);
          const double rb = a * std::sin(theta) + b * std::cos(theta);
          // theta_scale^i in fp32 (llama.cpp) carries <= (2i+1) u relative error in theta; the
          // rotation adds <= 4 u of |a|+|b| for cos/sin and the products.
          const double tol = (std::fabs(a) + std::fabs(b)) * ((2 * i + 1) * kU * theta + 4 * kU);
          CHECK(std::fabs(x[o] - ra) <= tol);
          CHECK(std::fabs(x[o + 1] - rb) <= tol);
        }
  }
}

TEST_CASE("swiglu computes silu(gate) * up", "[kernels]") {
  for (size_t n : {size_t(1), size_t(15), size_t(16), size_t(1000)}) {
    auto g = random_floats(n, -20, 20, 6);
    const auto up = random_floats(n, -3, 3, 7);
    if (n > 3) {
      g[0] = 90.0f;
      g[1] = -100.0f;
      g[2] = 0.0f;
    }
    std::vector<float> out(n);
    fd::kernels::swiglu(g.data(), up.data(), out.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const double ref = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * up[i];
      // exp within 1 ulp, then add, divide, multiply: <= 8 u relative, absolute floor for underflow.
      CHECK(std::fabs(out[i] - ref) <= 8 * kU * std::fabs(ref) + 1e-37);
    }
    auto alias = g;
    fd::kernels::swiglu(alias.data(), up.data(), alias.data(), n);
    CHECK(alias == out);
  }
}

TEST_CASE("add_inplace adds elementwise", "[kernels]") {
  for (size_t n : {size_t(1), size_t(17), size_t(1024)}) {
    auto y = random_floats(n, -1, 1, 8);
    const auto x = random_floats(n, -1, 1, 9);
    auto expect = y;
    for (size_t i = 0; i < n; ++i) expect[i] = y[i] + x[i];
    fd::kernels::add_inplace(y.data(), x.data(), n);
    CHECK(y == expect);
  }
}

TEST_CASE("copy_streaming copies like memcpy at any alignment and size", "[kernels]") {
  std::vector<uint8_t> src(4096 + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + 11);
  alignas(64) uint8_t dst[4096 + 256];
  // Aligned whole vectors take the streaming path; odd offsets and sizes fall back to memcpy.
  for_each_target([&] {
    for (size_t offset : {size_t(0), size_t(1), size_t(16), size_t(32), size_t(64)}) {
      for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(64), size_t(128), size_t(256), size_t(4096)}) {
        INFO("offset " << offset << ", " << bytes << " bytes");
        std::fill(std::begin(dst), std::end(dst), uint8_t{0xAB});
        fd::kernels::copy_streaming(dst + offset, src.data() + 3, bytes);
        fd::kernels::streaming_fence();
        CHECK(std::equal(src.begin() + 3, src.begin() + 3 + static_cast<long>(bytes), dst + offset));
        CHECK(std::all_of(dst, dst + offset, [](uint8_t x) { return x == 0xAB; }));
        CHECK(std::all_of(dst + offset + bytes, std::end(dst), [](uint8_t x) { return x == 0xAB; }));
      }
    }
  });
}

TEST_CASE("transpose_u16 matches the element-by-element transpose at any shape and stride", "[kernels]") {
  // Whole 8x8 blocks take the vector path on SIMD targets; the other rows and columns, the edges.
  for_each_target([&] {
    for (auto [rows, cols] : {std::pair{size_t(8), size_t(8)}, {16, 64}, {32, 64}, {9, 17}, {3, 130}, {1, 1}, {20, 7}}) {
      const size_t ss = cols + 3, ds = rows + 5;  // strides wider than the block
      std::vector<uint16_t> src(rows * ss);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
      std::vector<uint16_t> got(cols * ds, 0xBEEF), want(cols * ds, 0xBEEF);
      for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) want[c * ds + r] = src[r * ss + c];
      fd::kernels::transpose_u16(src.data(), rows, cols, ss, got.data(), ds);
      INFO(rows << "x" << cols);
      CHECK(got == want);  // the gaps between strides keep 0xBEEF
    }
  });
}
