#include <catch2/catch.hpp>

#include <hwy/targets.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_tile.h"
#include "kernels/attention_units.h"
#include "kernels/kv_format.h"
#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "kernels/thread_pool.h"
#include "tests/f16_block_layout.h"
#include "tests/simd_targets.h"

namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24: unit roundoff of fp32

double f16_value(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 0x3FF;
  const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(1024 + m), e - 25);
  return (h & 0x8000) ? -mag : mag;
}

// One sequence's K/V for one layer, stored as separately allocated blocks in the layout the
// kernel reads (per block [n_kv_heads][block_tokens][head_dim], the keys of a full block
// [n_kv_heads][head_dim][block_tokens]), plus the fp16 rows and a flat copy for the reference.
struct TestKv {
  int n_kv_heads, head_dim, block_tokens, len;
  std::vector<std::vector<uint16_t>> kb, vb;  // [blocks][n_kv_heads * block_tokens * head_dim]
  std::vector<const uint16_t*> kp, vp;
  std::vector<uint16_t> k16, v16;  // [len][n_kv_heads][head_dim]
  std::vector<double> k, v;        // [len][n_kv_heads][head_dim]

  TestKv(int nkv, int hd, int bt, int n, uint32_t seed)
      : n_kv_heads(nkv), head_dim(hd), block_tokens(bt), len(n) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const int blocks = (n + bt - 1) / bt;
    const size_t per_block = size_t(nkv) * bt * hd;
    kb.assign(size_t(blocks), std::vector<uint16_t>(per_block, 0x7E00));  // NaN padding: must be unread
    vb = kb;
    k.resize(size_t(n) * nkv * hd);
    v.resize(k.size());
    k16.resize(k.size());
    v16.resize(k.size());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < nkv; ++h)
        for (int i = 0; i < hd; ++i) {
          float pair[2] = {dist(rng), dist(rng)};
          uint16_t half[2];
          fd::kernels::f32_to_f16(pair, half, 2);
          kb[size_t(t / bt)][f16_block_layout::key_index(size_t(t), size_t(h), size_t(i), size_t(hd), size_t(bt),
                                                         size_t(n))] = half[0];
          vb[size_t(t / bt)][f16_block_layout::value_index(size_t(t), size_t(h), size_t(i), size_t(hd), size_t(bt),
                                                           size_t(n))] =
              half[1];
          const size_t at = (size_t(t) * nkv + h) * hd + i;
          k16[at] = half[0];
          v16[at] = half[1];
          k[at] = f16_value(half[0]);
          v[at] = f16_value(half[1]);
        }
    for (int b = 0; b < blocks; ++b) {
      kp.push_back(kb[size_t(b)].data());
      vp.push_back(vb[size_t(b)].data());
    }
  }
  fd::kernels::KvBlocksF16 view() const { return {kp.data(), vp.data(), block_tokens, len}; }
};

// Double-precision softmax attention; also returns the per-element error bound.
// Bound (rounding errors of random sign grow like sqrt(terms)): a score carries fp32 dot-product
// error ~ sqrt(hd) u S (S = scale * sum|q k|); a score error e moves the normalised weights by
// <= 2e relative, hence the output by <= 2e max|v|. The streaming sum over len values adds
// ~ sqrt(len) u max|v| (x2 margin); exp, rescaling and the final division add <= 8 u.
// qs: the queries already multiplied by 1/sqrt(head_dim).
void reference_scaled(const std::vector<double>& qs, int n_q, int q_pos0, const TestKv& kv, int n_heads,
                      std::vector<double>& out, std::vector<double>& tol) {
  const int hd = kv.head_dim, g = n_heads / kv.n_kv_heads;
  const auto& q = qs;
  out.assign(q.size(), 0.0);
  tol.assign(q.size(), 0.0);
  for (int r = 0; r < n_q; ++r)
    for (int h = 0; h < n_heads; ++h) {
      const int kvh = h / g, n = q_pos0 + r + 1;
      const double* qh = &q[(size_t(r) * n_heads + h) * hd];
      std::vector<double> s(size_t(n), 0.0);
      double smax = -1e300, sabs = 0, vabs = 0;
      for (int t = 0; t < n; ++t) {
        double dot = 0, mag = 0;
        for (int i = 0; i < hd; ++i) {
          const double kk = kv.k[(size_t(t) * kv.n_kv_heads + kvh) * hd + i];
          dot += qh[i] * kk;
          mag += std::fabs(qh[i] * kk);
          vabs = std::max(vabs, std::fabs(kv.v[(size_t(t) * kv.n_kv_heads + kvh) * hd + i]));
        }
        s[size_t(t)] = dot;
        smax = std::max(smax, s[size_t(t)]);
        sabs = std::max(sabs, mag);
      }
      double den = 0;
      for (auto& x : s) den += (x = std::exp(x - smax));
      double* o = &out[(size_t(r) * n_heads + h) * hd];
      for (int t = 0; t < n; ++t)
        for (int i = 0; i < hd; ++i) o[i] += s[size_t(t)] / den * kv.v[(size_t(t) * kv.n_kv_heads + kvh) * hd + i];
      const double bound =
          vabs * kU * (2 * std::sqrt(double(hd)) * sabs + 2 * std::sqrt(double(n)) + 8);
      std::fill(&tol[(size_t(r) * n_heads + h) * hd], &tol[(size_t(r) * n_heads + h) * hd] + hd, bound);
    }
}

void reference(const std::vector<float>& q, int n_q, int q_pos0, const TestKv& kv, int n_heads,
               std::vector<double>& out, std::vector<double>& tol) {
  std::vector<double> qs(q.size());
  for (size_t i = 0; i < q.size(); ++i) qs[i] = q[i] / std::sqrt(double(kv.head_dim));
  reference_scaled(qs, n_q, q_pos0, kv, n_heads, out, tol);
}

// q_range: the queries' elements are uniform in [-q_range, q_range]; the default 3 makes the scaled
// scores about unit normal, peaky enough to exercise the max shift.
void check_case(int len, int head_dim, int gqa, int n_q, int block_tokens, uint32_t seed, float q_range = 3.0f) {
  const int n_kv_heads = 2, n_heads = n_kv_heads * gqa;
  INFO("len " << len << " head_dim " << head_dim << " gqa " << gqa << " n_q " << n_q << " block "
              << block_tokens << " q_range " << q_range);
  const TestKv kv(n_kv_heads, head_dim, block_tokens, len, seed);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> dist(-q_range, q_range);
  std::vector<float> q(size_t(n_q) * n_heads * head_dim);
  for (auto& x : q) x = dist(rng);
  const int q_pos0 = len - n_q;
  std::vector<float> out(q.size(), -1.0f);
  fd::kernels::attention_f16(q.data(), n_q, q_pos0, kv.view(), {n_heads, n_kv_heads, head_dim}, out.data());
  std::vector<double> ref, tol;
  reference(q, n_q, q_pos0, kv, n_heads, ref, tol);
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double err = std::fabs(out[i] - ref[i]);
    worst = std::max(worst, err / tol[i]);
    if (!(err <= tol[i]) && bad++ < 3)
      FAIL_CHECK("element " << i << ": " << out[i] << " vs " << ref[i] << " (tol " << tol[i] << ")");
  }
  CHECK(bad == 0);
  CHECK(worst < 1.0);
}

// Checks exp_fn (softmax_exp or softmax_exp_coarse) against std::exp where exp(x) >= FLT_MIN, in
// ulp of the reference and as a relative error, and its handling of the range's ends and NaN.
// grows: the bounds are scaled by 1 + |x| (softmax_weight_exp, whose reduction rounds x log2(e)).
// max_x: positive x up to this are checked too (the fp16 weights' kSoftmaxSlack).
void check_softmax_exp(void (*exp_fn)(const float*, float*, size_t), double max_ulp, double max_rel,
                       bool grows = false, float max_x = 0.0f) {
  std::vector<float> x;
  for (float v = -1e-30f; v > -87.3f; v *= 1.0001f) x.push_back(v);  // exp(v) >= FLT_MIN
  for (float v = 1e-30f; v <= max_x; v *= 1.0001f) x.push_back(v);
  if (max_x > 0.0f) x.push_back(max_x);
  const size_t normal = x.size() + 2;
  x.insert(x.begin(), {0.0f, -0.0f});
  x.insert(x.end(), {-87.8f, -88.0f, -100.0f, -1e30f, -std::numeric_limits<float>::infinity()});
  x.push_back(-1.0f);  // an odd count: the last values take the single-lane tail
  std::vector<float> y(x.size());
  for_each_simd_target([&](int64_t target) {
    INFO("target " << hwy::TargetName(target));
    std::fill(y.begin(), y.end(), -1.0f);
    exp_fn(x.data(), y.data(), x.size());
    double worst = 0.0, worst_rel = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double ref = std::exp(double(x[i]));
      if (i < normal || i + 1 == x.size()) {
        const double scale = grows ? 1.0 + std::fabs(double(x[i])) : 1.0;
        worst = std::max(worst, std::fabs(y[i] - ref) / std::ldexp(1.0, std::ilogb(ref) - 23) / scale);
        worst_rel = std::max(worst_rel, std::fabs(y[i] - ref) / ref / scale);
      } else {
        INFO("x = " << x[i]);
        CHECK(y[i] >= 0.0f);
        CHECK(y[i] <= std::numeric_limits<float>::min());
      }
    }
    INFO("worst error " << worst << " ulp, " << worst_rel << " relative, over " << normal << " values");
    CHECK(worst <= max_ulp);
    CHECK(worst_rel <= max_rel);
    CHECK(y[0] == 1.0f);  // r = 0 and n = 0: exact for any polynomial
    CHECK(y[x.size() - 2] == 0.0f);  // -inf
    // A NaN score (a NaN in q or K) must reach the output, not turn into a zero weight: in a
    // vector and in the single-lane tail.
    std::vector<float> nan_in(17, -1.0f), nan_out(17);
    nan_in[3] = nan_in[16] = std::numeric_limits<float>::quiet_NaN();
    exp_fn(nan_in.data(), nan_out.data(), nan_in.size());
    CHECK(std::isnan(nan_out[3]));
    CHECK(std::isnan(nan_out[16]));
    CHECK(nan_out[4] == Approx(std::exp(-1.0)).epsilon(max_rel));
  });
}

}  // namespace

TEST_CASE("softmax_exp is within 2 ulp of exp on every SIMD target", "[attention]") {
  // Its polynomial is hn::Exp's (1 ulp); 2 ulp leaves room for targets without FMA.
  check_softmax_exp(fd::kernels::softmax_exp, 2.0, 2.4e-7);
}

TEST_CASE("softmax_weight_exp is within 2 (1 + |x|) ulp of exp up to kSoftmaxSlack on every SIMD target",
          "[attention]") {
  // 6.0e-9 from its polynomial (AVX-512), the rest from rounding x log2(e) and the multiply-adds.
  check_softmax_exp(fd::kernels::softmax_weight_exp, 2.0, 2.4e-7, true, fd::kernels::kSoftmaxSlack);
}

TEST_CASE("softmax_exp_coarse is within 1.3e-4 of exp on every SIMD target", "[attention]") {
  // The polynomial's relative error is 1.23e-4; a few roundings of fp32 add about 3e-7.
  check_softmax_exp(fd::kernels::softmax_exp_coarse, std::numeric_limits<double>::infinity(), 1.3e-4);
}

TEST_CASE("attention_f16 decode matches a double-precision reference", "[attention]") {
  for (int len : {1, 7, 16, 17, 33, 1000})
    for (int hd : {64, 128})
      for (int gqa : {1, 4, 8}) check_case(len, hd, gqa, 1, 16, uint32_t(len * 31 + hd + gqa));
}

TEST_CASE("attention_f16 causal prefill matches a double-precision reference", "[attention]") {
  for (int hd : {64, 128})
    for (int gqa : {1, 4, 8}) {
      for (int len : {1, 7, 33}) check_case(len, hd, gqa, len, 16, uint32_t(len + hd + gqa));
      check_case(1000, hd, gqa, 24, 16, uint32_t(hd + gqa));  // a chunk at the end of a long prompt
    }
}

TEST_CASE("attention_f16 matches the reference when the largest score climbs far past the first keys'", "[attention]") {
  // Scaled scores of about 20 standard deviation: the running max climbs by some 30 after the
  // first blocks, past kSoftmaxSlack several times, so that tiles that keep a query's m and tiles
  // that move it (rescaling what the kept ones summed) alternate.
  for (int hd : {64, 128})
    for (int gqa : {1, 4}) {
      check_case(1000, hd, gqa, 1, 16, uint32_t(hd * 3 + gqa), 60.0f);
      check_case(1000, hd, gqa, 1, 64, uint32_t(hd * 5 + gqa), 60.0f);
      check_case(1000, hd, gqa, 24, 16, uint32_t(hd * 7 + gqa), 60.0f);  // a chunk of prefill
    }
}

TEST_CASE("attention_f16 handles odd block sizes and narrow heads", "[attention]") {
  for (int bt : {1, 5, 16, 20, 48})  // 20: a key group of 16 and one of 4 when sealed
    for (int len : {7, 33, 100}) {
      check_case(len, 64, 4, 1, bt, uint32_t(bt * 7 + len));
      check_case(len, 8, 2, std::min(9, len), bt, uint32_t(bt * 5 + len));   // head_dim 8 (stories260K)
      check_case(len, 20, 1, 3, bt, uint32_t(bt * 3 + len));  // head_dim not a multiple of 8
    }
}

TEST_CASE("attention_f16 gives the same answer on every SIMD target", "[attention]") {
  for_each_simd_target([&](int64_t target) {
    INFO("target " << hwy::TargetName(target));
    check_case(100, 64, 4, 3, 16, 11);
    check_case(40, 128, 1, 1, 16, 12);
    check_case(21, 8, 2, 5, 5, 13);
    check_case(45, 20, 4, 2, 20, 14);  // partial key groups and value chunks
  });
}

TEST_CASE("attention_f16 with one visible key returns that value row", "[attention]") {
  const TestKv kv(1, 64, 16, 40, 99);
  std::vector<float> q(64, 2.5f), out(64);
  fd::kernels::attention_f16(q.data(), 1, 0, kv.view(), {1, 1, 64}, out.data());
  for (int i = 0; i < 64; ++i) CHECK(out[size_t(i)] == static_cast<float>(kv.v[size_t(i)]));
}

TEST_CASE("attention_f16 rejects queries beyond the cached length", "[attention]") {
  const TestKv kv(1, 64, 16, 10, 1);
  std::vector<float> q(64), out(64);
  CHECK_THROWS_AS(fd::kernels::attention_f16(q.data(), 1, 10, kv.view(), {1, 1, 64}, out.data()),
                  std::invalid_argument);
}

namespace {

// Quantized K/V built through a KvFormat: blocks as the kernel reads them, and for the
// references both the fp16 values before quantization and the decoded values.
struct QuantKv {
  fd::kernels::KvDtype dtype;
  int n_kv_heads, head_dim, block_tokens, len;
  std::vector<std::vector<uint8_t>> kb, vb;  // [blocks][n_kv_heads][head_block_bytes]
  std::vector<const uint8_t*> kp, vp;
  TestKv src;                                // the fp16 originals (same seed)
  std::vector<double> kq, vq;                // decoded: [len][n_kv_heads][head_dim]

  QuantKv(fd::kernels::KvDtype dt, int nkv, int hd, int bt, int n, uint32_t seed)
      : dtype(dt), n_kv_heads(nkv), head_dim(hd), block_tokens(bt), len(n), src(nkv, hd, bt, n, seed) {
    const auto& f = fd::kernels::kv_format(dt);
    const size_t hb = f.head_block_bytes(bt, hd);
    const int blocks = (n + bt - 1) / bt;
    kb.assign(size_t(blocks), std::vector<uint8_t>(size_t(nkv) * hb, 0xFF));
    vb = kb;
    kq.resize(src.k.size());
    vq.resize(src.v.size());
    std::vector<float> row(static_cast<size_t>(hd));
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < nkv; ++h) {
        uint8_t* kh = kb[size_t(t / bt)].data() + size_t(h) * hb;
        uint8_t* vh = vb[size_t(t / bt)].data() + size_t(h) * hb;
        const size_t at = (size_t(t) * nkv + h) * hd;
        f.encode_row(fd::kernels::KvPart::key, src.k16.data() + at, hd, bt, t % bt, kh);
        f.encode_row(fd::kernels::KvPart::value, src.v16.data() + at, hd, bt, t % bt, vh);
        f.decode_row(fd::kernels::KvPart::key, kh, hd, bt, t % bt, row.data());
        for (int i = 0; i < hd; ++i) kq[(size_t(t) * nkv + h) * hd + i] = row[size_t(i)];
        f.decode_row(fd::kernels::KvPart::value, vh, hd, bt, t % bt, row.data());
        for (int i = 0; i < hd; ++i) vq[(size_t(t) * nkv + h) * hd + i] = row[size_t(i)];
      }
    std::vector<uint8_t> scratch(hb);
    for (int b = 0; b < blocks; ++b) {
      if ((b + 1) * bt <= n)  // full blocks are sealed, as the store does
        for (int h = 0; h < nkv; ++h) {
          f.seal(fd::kernels::KvPart::key, kb[size_t(b)].data() + size_t(h) * hb, hd, bt, scratch.data());
          f.seal(fd::kernels::KvPart::value, vb[size_t(b)].data() + size_t(h) * hb, hd, bt, scratch.data());
        }
      kp.push_back(kb[size_t(b)].data());
      vp.push_back(vb[size_t(b)].data());
    }
  }
  fd::kernels::KvBlocks view() const { return {dtype, kp.data(), vp.data(), block_tokens, len}; }
  // The decoded values as an fp16-free TestKv, for the double-precision reference.
  TestKv decoded() const {
    TestKv d = src;
    d.k = kq;
    d.v = vq;
    return d;
  }
};

// Largest rounding error of the format for a group whose largest magnitude is amax: half a step
// (q8: amax/127 / 2, q4: amax/7 / 2); q4 stores its scale as fp16 (relative rounding <= 2^-11),
// which widens its step by that factor.
double half_step(fd::kernels::KvDtype dt, double amax) {
  return dt == fd::kernels::KvDtype::q8 ? amax / 254.0 : amax / 14.0 * (1.0 + 1.0 / 2048.0);
}

// The query transform of the quantized formats (kernels/kv_format.h), written out here: in fp32
// x = q * fl(1/sqrt(hd)), scale = max|x| / 127, x -> round(x / scale) * scale.
// Returns the transformed queries in double; f16 keeps q / sqrt(hd) unrounded.
std::vector<double> transformed_q(const std::vector<float>& q, int hd, fd::kernels::KvDtype dt) {
  std::vector<double> out(q.size());
  const float scale = 1.0f / std::sqrt(float(hd));
  for (size_t r = 0; r < q.size() / size_t(hd); ++r) {
    const float* qr = &q[r * size_t(hd)];
    double* o = &out[r * size_t(hd)];
    if (dt == fd::kernels::KvDtype::f16) {
      for (int c = 0; c < hd; ++c) o[c] = qr[c] / std::sqrt(double(hd));
      continue;
    }
    const float levels = 127.0f;
    float amax = 0.0f;
    for (int c = 0; c < hd; ++c) amax = std::max(amax, std::fabs(qr[c] * scale));
    const float s = amax / levels, inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int c = 0; c < hd; ++c) {
      const float x = qr[c] * scale;
      o[c] = double(s) * std::clamp(std::nearbyint(x * inv), -levels, levels);
    }
  }
  return out;
}

// The largest query scale max|q / sqrt(hd)| / 127 over the rows of q (0 for f16).
double max_query_scale(const std::vector<float>& q, int hd, fd::kernels::KvDtype dt) {
  if (dt == fd::kernels::KvDtype::f16) return 0.0;
  double amax = 0;
  for (float x : q) amax = std::max(amax, std::fabs(double(x)));
  return amax / std::sqrt(double(hd)) / 127.0;
}

// Standard deviation, per output element, of the error that rounding the value weights adds
// (kernels/kv_format.h): per tile T of kWeightTileKeys keys of a block and scale group, the
// weights p_t * scale_t are rounded to multiples of f_T = max p * max scale / W (q8: W = 127,
// q4: 255; max scale over the tile's cached rows, a bound on the kernel's), each error uniform in
// +-f_T / 2 and independent, multiplying the stored integer v_t / scale_t; divided by the softmax
// denominator.
// qs: transformed queries [n_q][n_heads][hd]; kv: the decoded values. Zero for f16.
std::vector<double> weight_rounding_sigma(fd::kernels::KvDtype dt, const std::vector<double>& qs, int n_q,
                                          int q_pos0, const TestKv& kv, int n_heads) {
  std::vector<double> sigma(qs.size(), 0.0);
  if (dt == fd::kernels::KvDtype::f16) return sigma;
  const int hd = kv.head_dim, g = n_heads / kv.n_kv_heads, bt = kv.block_tokens;
  const int group = dt == fd::kernels::KvDtype::q8 ? hd : 32, levels = dt == fd::kernels::KvDtype::q8 ? 127 : 7;
  const auto value = [&](int t, int kvh, int i) { return kv.v[(size_t(t) * kv.n_kv_heads + kvh) * hd + i]; };
  const auto scale = [&](int t, int kvh, int grp) {
    double amax = 0;
    for (int i = grp * group; i < (grp + 1) * group; ++i) amax = std::max(amax, std::fabs(value(t, kvh, i)));
    return amax / levels;
  };
  for (int r = 0; r < n_q; ++r)
    for (int h = 0; h < n_heads; ++h) {
      const int kvh = h / g, n = q_pos0 + r + 1;
      const double* qh = &qs[(size_t(r) * n_heads + h) * hd];
      std::vector<double> p(static_cast<size_t>(n));
      double smax = -1e300, den = 0;
      for (int t = 0; t < n; ++t) {
        double dot = 0;
        for (int i = 0; i < hd; ++i) dot += qh[i] * kv.k[(size_t(t) * kv.n_kv_heads + kvh) * hd + i];
        p[size_t(t)] = dot;
        smax = std::max(smax, dot);
      }
      for (auto& x : p) den += (x = std::exp(x - smax));
      std::vector<double> var(size_t(hd), 0.0);
      const int tile = fd::kernels::kWeightTileKeys;
      for (int b0 = 0; b0 < n; b0 += bt)
        for (int t0 = b0; t0 < std::min(b0 + bt, n); t0 += tile) {
          const int end = std::min({t0 + tile, b0 + bt, n});
          const int cached_end = std::min({t0 + tile, b0 + bt, kv.len});
          double pmax = 0;
          for (int t = t0; t < end; ++t) pmax = std::max(pmax, p[size_t(t)]);
          for (int grp = 0; grp < hd / group; ++grp) {
            double sc_max = 0;
            for (int t = t0; t < cached_end; ++t) sc_max = std::max(sc_max, scale(t, kvh, grp));
            const double f = pmax * sc_max / (dt == fd::kernels::KvDtype::q8 ? 127.0 : 255.0);
            for (int t = t0; t < end; ++t) {
              const double sc = scale(t, kvh, grp);
              if (sc == 0) continue;
              for (int i = grp * group; i < (grp + 1) * group; ++i)
                var[size_t(i)] += f * f / 12.0 * (value(t, kvh, i) / sc) * (value(t, kvh, i) / sc);
            }
          }
        }
      for (int i = 0; i < hd; ++i) sigma[(size_t(r) * n_heads + h) * hd + i] = std::sqrt(var[size_t(i)]) / den;
    }
  return sigma;
}

std::vector<float> random_q(size_t n, float range, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> q(n);
  for (auto& x : q) x = dist(rng);
  return q;
}

}  // namespace

TEST_CASE("quantized KV formats stay within half a quantization step", "[attention]") {
  using fd::kernels::KvDtype;
  for (KvDtype dt : {KvDtype::q8, KvDtype::q4}) {
    const auto& f = fd::kernels::kv_format(dt);
    INFO(f.name());
    CHECK(f.dtype() == dt);
    CHECK_FALSE(f.supports(300));
    const int hd = 128, bt = 16;
    const QuantKv kv(dt, 2, hd, bt, 40, 21);
    const int group = dt == KvDtype::q8 ? hd : 32;
    size_t bad = 0, changed = 0;
    for (size_t r = 0; r < kv.kq.size() / size_t(group); ++r) {
      double amax = 0;
      for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(kv.src.k[r * group + size_t(i)]));
      for (int i = 0; i < group; ++i) {
        const double x = kv.src.k[r * group + size_t(i)], y = kv.kq[r * group + size_t(i)];
        // Rounding to the grid: <= step/2, plus fp32 rounding of x/scale and q*scale (<= 2^-20 amax).
        bad += std::fabs(x - y) > half_step(dt, amax) + amax * 1e-6;
        changed += x != y;
      }
    }
    CHECK(bad == 0);
    CHECK(changed > kv.kq.size() / 2);  // really quantized
  }
  CHECK_FALSE(fd::kernels::kv_format(KvDtype::q4).supports(48));
  fd::kernels::KvDtype parsed;
  CHECK(fd::kernels::parse_kv_dtype("q4", &parsed));
  CHECK(parsed == KvDtype::q4);
  CHECK(fd::kernels::parse_kv_dtype("int8", &parsed));  // fastdecode-node's names
  CHECK(parsed == KvDtype::q8);
  CHECK(fd::kernels::parse_kv_dtype("int4", &parsed));
  CHECK(parsed == KvDtype::q4);
  CHECK_FALSE(fd::kernels::parse_kv_dtype("i4", &parsed));
}

TEST_CASE("sealing a q8 block moves its keys into element pairs and unsealing restores them", "[attention]") {
  using fd::kernels::KvPart;
  const auto& f = fd::kernels::kv_format(fd::kernels::KvDtype::q8);
  for (auto [hd, bt] : {std::pair{64, 16}, {8, 7}, {6, 3}}) {
    INFO("hd " << hd << " block " << bt);
    const size_t hb = f.head_block_bytes(bt, hd);
    std::vector<uint8_t> block(hb, 0), scratch(hb);
    std::vector<uint16_t> row(static_cast<size_t>(hd));
    for (int t = 0; t < bt; ++t) {
      std::vector<float> x(static_cast<size_t>(hd));
      for (int i = 0; i < hd; ++i) x[size_t(i)] = float((t * 31 + i * 7) % 23) - 11.0f;
      fd::kernels::f32_to_f16(x.data(), row.data(), x.size());
      f.encode_row(KvPart::key, row.data(), hd, bt, t, block.data());
    }
    const auto rows = block;
    f.seal(KvPart::value, block.data(), hd, bt, scratch.data());  // values keep their layout
    CHECK(block == rows);
    f.seal(KvPart::key, block.data(), hd, bt, scratch.data());
    const size_t data_off = fd::kernels::detail::q8_data_offset(size_t(bt));
    const uint8_t* data = block.data() + data_off;
    const uint8_t* was = rows.data() + data_off;
    size_t misplaced = 0;
    for (int t = 0; t < bt; ++t)
      for (int i = 0; i < hd; ++i)
        misplaced += data[fd::kernels::detail::q8_key_index(true, size_t(t), size_t(i), size_t(hd), size_t(bt))] !=
                     was[size_t(t) * size_t(hd) + size_t(i)];
    CHECK(misplaced == 0);
    CHECK(std::equal(rows.begin(), rows.begin() + long(data_off), block.begin()));  // scales stay
    CHECK(block != rows);
    f.unseal(KvPart::key, block.data(), hd, bt, scratch.data());
    CHECK(block == rows);
  }
}

TEST_CASE("a quantized row with a NaN or an infinity decodes to NaN and leaves its block's other rows",
          "[attention]") {
  using fd::kernels::KvDtype;
  const int hd = 64, bt = 4;
  for (KvDtype dt : {KvDtype::q8, KvDtype::q4})
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
      for (auto part : {fd::kernels::KvPart::key, fd::kernels::KvPart::value}) {
        const auto& f = fd::kernels::kv_format(dt);
        INFO(f.name() << " " << bad << (part == fd::kernels::KvPart::key ? " key" : " value"));
        std::vector<uint8_t> block(f.head_block_bytes(bt, hd));
        std::vector<float> x(hd);
        for (int i = 0; i < hd; ++i) x[size_t(i)] = 0.01f * float(i - 30);
        std::vector<uint16_t> good(hd), poisoned(hd);
        fd::kernels::f32_to_f16(x.data(), good.data(), x.size());
        x[40] = bad;  // in the second q4 scale group
        fd::kernels::f32_to_f16(x.data(), poisoned.data(), x.size());
        f.encode_row(part, good.data(), hd, bt, 0, block.data());
        f.encode_row(part, poisoned.data(), hd, bt, 1, block.data());
        std::vector<float> row0(hd), row1(hd);
        f.decode_row(part, block.data(), hd, bt, 0, row0.data());
        f.decode_row(part, block.data(), hd, bt, 1, row1.data());
        size_t nan = 0, off = 0;
        for (int i = 0; i < hd; ++i) {
          nan += std::isnan(row1[size_t(i)]);
          off += !(std::fabs(row0[size_t(i)] - 0.01f * float(i - 30)) <= half_step(dt, 0.34) + 1e-3);
        }
        // q8: one scale per row; q4: one per group of 32, and the other group stays finite.
        CHECK(nan == (dt == KvDtype::q8 ? size_t(hd) : size_t(32)));
        CHECK(off == 0);
      }
}

namespace {

// for_each_simd_target with AVX3_DL, which the quantized attention builds (VNNI).
template <class Fn>
void for_each_kernel_target(const Fn& fn) {
  for_each_simd_target(fn, true);
}

// One case through attention() and through attention_batch on 1 and 2 threads (bit-identical),
// checked against the decoded values and against the fp16 originals.
// q_range: queries are uniform in +-q_range (larger: more sharply peaked attention).
void check_quant_case(fd::kernels::KvDtype dt, int len, int hd, int gqa, int n_q, int bt, uint32_t seed,
                      float q_range = 2.0f) {
  INFO(fd::kernels::kv_dtype_name(dt) << " hd " << hd << " len " << len << " n_q " << n_q << " gqa " << gqa
                                      << " block " << bt);
  const int n_kv = 2, n_heads = n_kv * gqa;
  const fd::kernels::AttnDims d{n_heads, n_kv, hd};
  const QuantKv kv(dt, n_kv, hd, bt, len, seed);
  const auto q = random_q(size_t(n_q) * n_heads * hd, q_range, seed + 5);
  std::vector<float> out(q.size());
  fd::kernels::attention(q.data(), n_q, len - n_q, kv.view(), d, out.data());
  for (int threads : {1, 2}) {
    fd::kernels::ThreadPool pool(threads);
    std::vector<float> got(q.size(), -7.0f);
    const fd::kernels::AttnItem item{q.data(), got.data(), n_q, len - n_q, kv.view()};
    fd::kernels::attention_batch(&item, 1, d, pool);
    CHECK(got == out);
  }

  // With the decoded K/V and the transformed query only fp32 rounding remains: reference()'s bound.
  std::vector<double> dec, dec_tol, exact, exact_tol;
  reference_scaled(transformed_q(q, hd, dt), n_q, len - n_q, kv.decoded(), n_heads, dec, dec_tol);
  reference(q, n_q, len - n_q, kv.src, n_heads, exact, exact_tol);
  // Against the fp16 originals: key rounding errors e (uniform within +-e_k, independent per
  // element) move a score by sigma_k = sqrt(sum q^2 e_k^2 / 3) / sqrt(hd); query rounding errors
  // (uniform within +-qscale/2) by sigma_q = qscale/2 * sqrt(sum k^2 / 3) <= qscale/2 * kmax *
  // sqrt(hd / 3). Allow 6 sigma: output error <= 2 * 6 sigma * max|v| through the weights, plus
  // the largest value error e_v.
  double e_k = 0, e_v = 0, vmax = 0, kmax = 0;
  for (size_t i = 0; i < kv.kq.size(); ++i) {
    e_k = std::max(e_k, std::fabs(kv.kq[i] - kv.src.k[i]));
    e_v = std::max(e_v, std::fabs(kv.vq[i] - kv.src.v[i]));
    vmax = std::max(vmax, std::fabs(kv.src.v[i]));
    kmax = std::max(kmax, std::fabs(kv.kq[i]));
  }
  double q2max = 0;
  for (size_t r = 0; r < q.size() / size_t(hd); ++r) {
    double q2 = 0;
    for (int i = 0; i < hd; ++i) q2 += double(q[r * hd + size_t(i)]) * q[r * hd + size_t(i)];
    q2max = std::max(q2max, q2);
  }
  const double sigma_k = std::sqrt(q2max * e_k * e_k / 3.0) / std::sqrt(double(hd));
  const double sigma_q = max_query_scale(q, hd, dt) / 2 * kmax * std::sqrt(hd / 3.0);
  const double quant_tol = 2 * 6 * std::hypot(sigma_k, sigma_q) * vmax + e_v;
  // Rounding the value weights: 6 sigma on top of both bounds.
  const auto weights = weight_rounding_sigma(dt, transformed_q(q, hd, dt), n_q, len - n_q, kv.decoded(), n_heads);
  size_t bad_dec = 0, bad_exact = 0;
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double tol = dec_tol[i] + 6 * weights[i];
    worst = std::max(worst, std::fabs(out[i] - dec[i]) / tol);
    bad_dec += !(std::fabs(out[i] - dec[i]) <= tol);
    bad_exact += !(std::fabs(out[i] - exact[i]) <= quant_tol + exact_tol[i] + 6 * weights[i]);
  }
  INFO("worst error / bound vs decoded " << worst);
  CHECK(bad_dec == 0);
  CHECK(bad_exact == 0);
  if (dt == fd::kernels::KvDtype::f16) CHECK(e_k == 0);
}

}  // namespace

TEST_CASE("the q8 and q4 row quantizers give the scalar formula's integers on every SIMD target", "[attention]") {
  // The formulas of kernels/quantize.h in plain scalar code: the scale rounded to fp16, fp32
  // product, rounding to nearest even (the default mode of nearbyint).
  // Scale s32 rounded to fp16: its bits into bits, and its value as read back.
  const auto round_to_f16 = [](float s32, uint16_t& bits) {
    fd::kernels::f32_to_f16(&s32, &bits, 1);
    float scale;
    fd::kernels::f16_to_f32(&bits, &scale, 1);
    return scale;
  };
  const auto f16_is_nan = [](uint16_t b) { return (b & 0x7C00) == 0x7C00 && (b & 0x3FF) != 0; };
  const auto q8_ref = [&](const std::vector<float>& x, std::vector<int8_t>& q) {
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::isfinite(v) ? std::fabs(v) : std::numeric_limits<float>::infinity());
    q.assign(x.size(), 0);
    uint16_t bits;
    const float scale =
        round_to_f16(std::isinf(amax) ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f, bits);
    if (std::isnan(scale)) return bits;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (size_t i = 0; i < x.size(); ++i) q[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
    return bits;
  };
  const auto q4_ref = [&](const std::vector<float>& x, std::vector<uint8_t>& bytes, std::vector<uint16_t>& scales) {
    bytes.assign(x.size() / 2, 0x88);
    scales.assign(x.size() / 32, 0);
    for (size_t g = 0; g < x.size() / 32; ++g) {
      float amax = 0.0f;
      for (size_t i = 32 * g; i < 32 * g + 32; ++i)
        amax = std::max(amax, std::isfinite(x[i]) ? std::fabs(x[i]) : std::numeric_limits<float>::infinity());
      const float scale =
          round_to_f16(std::isinf(amax) ? std::numeric_limits<float>::quiet_NaN() : amax / 7.0f, scales[g]);
      if (std::isnan(scale)) continue;
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      const auto nib = [&](size_t i) { return unsigned(std::clamp(std::nearbyint(x[i] * inv), -7.0f, 7.0f) + 8.0f); };
      for (size_t j = 0; j < 16; ++j) bytes[16 * g + j] = uint8_t(nib(32 * g + j) | nib(32 * g + 16 + j) << 4);
    }
  };
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t n : {size_t(7), size_t(20), size_t(32), size_t(64), size_t(96), size_t(128), size_t(256)})
    for (int kind = 0; kind < 5; ++kind) {
      // Random; all zeros; ties (halves of the q8 grid); a NaN; an infinity (q4: in group 0 only).
      std::vector<float> x(n);
      for (auto& v : x) v = kind == 1 ? 0.0f : dist(rng);
      if (kind == 2)
        for (size_t i = 0; i < n; ++i) x[i] = i == 0 ? 127.0f : float(int(i % 50) - 25) + 0.5f;
      if (kind == 3) x[n / 2] = std::numeric_limits<float>::quiet_NaN();
      if (kind == 4) x[1] = -std::numeric_limits<float>::infinity();
      std::vector<uint16_t> h(n);
      fd::kernels::f32_to_f16(x.data(), h.data(), n);
      fd::kernels::f16_to_f32(h.data(), x.data(), n);  // the values the quantizers see
      std::vector<int8_t> want8;
      const uint16_t want_scale = q8_ref(x, want8);
      std::vector<uint8_t> want4;
      std::vector<uint16_t> want_scales;
      if (n % 32 == 0) q4_ref(x, want4, want_scales);
      for_each_simd_target([&](int64_t target) {
        INFO("target " << hwy::TargetName(target) << " n " << n << " kind " << kind);
        std::vector<int8_t> got8(n, 99);
        const uint16_t scale = fd::kernels::quantize_row_q8(h.data(), n, got8.data());
        CHECK(got8 == want8);
        CHECK((scale == want_scale || (f16_is_nan(scale) && f16_is_nan(want_scale))));
        if (n % 32 != 0) return;
        std::vector<uint8_t> got4(n / 2, 0);
        std::vector<uint16_t> got_scales(n / 32, 0);
        fd::kernels::quantize_row_q4(h.data(), n, got4.data(), got_scales.data());
        CHECK(got4 == want4);
        for (size_t g = 0; g < n / 32; ++g)
          CHECK((got_scales[g] == want_scales[g] || (f16_is_nan(want_scales[g]) && f16_is_nan(got_scales[g]))));
      });
    }
}

TEST_CASE("quantized decode attention matches the references for every dtype", "[attention]") {
  using fd::kernels::KvDtype;
  for (KvDtype dt : {KvDtype::f16, KvDtype::q8, KvDtype::q4})
    for (int hd : {64, 128})
      for (int gqa : {1, 4, 8})
        for (int len : {1, 7, 33, 1000}) check_quant_case(dt, len, hd, gqa, 1, 16, uint32_t(len * 3 + hd + gqa));
}

TEST_CASE("quantized causal prefill matches the references for every dtype", "[attention]") {
  using fd::kernels::KvDtype;
  for (KvDtype dt : {KvDtype::f16, KvDtype::q8, KvDtype::q4})
    for (int hd : {64, 128})
      for (int gqa : {1, 4})
        for (auto [len, n_q, bt] : {std::tuple{33, 33, 16}, {70, 5, 7}, {40, 40, 5}, {1000, 24, 16}, {9, 9, 1}})
          check_quant_case(dt, len, hd, gqa, n_q, bt, uint32_t(len + n_q + hd + gqa));
}

TEST_CASE("quantized attention stays within its bounds when attention is sharply peaked", "[attention]") {
  // A few keys carry nearly all the weight, so most tiles' value weights are tiny next to the
  // running maximum: their rounding must stay relative to their own tile.
  using fd::kernels::KvDtype;
  for (KvDtype dt : {KvDtype::q8, KvDtype::q4})
    for (int hd : {64, 128})
      for (int gqa : {1, 4}) check_quant_case(dt, 2000, hd, gqa, 2, 64, uint32_t(hd + gqa), 16.0f);
}

TEST_CASE("quantized attention matches the references when the largest score climbs far past the first keys'",
          "[attention]") {
  // As for attention_f16: scaled scores of about 20 standard deviations, so that the running max
  // climbs past kSoftmaxSlack several times and tiles that keep a query's m alternate with tiles
  // that move it.
  using fd::kernels::KvDtype;
  for (KvDtype dt : {KvDtype::q8, KvDtype::q4})
    for (int hd : {64, 128})
      for (int gqa : {1, 4}) {
        check_quant_case(dt, 1000, hd, gqa, 1, 16, uint32_t(hd * 3 + gqa), 60.0f);
        check_quant_case(dt, 1000, hd, gqa, 1, 64, uint32_t(hd * 5 + gqa), 60.0f);
        check_quant_case(dt, 1000, hd, gqa, 24, 16, uint32_t(hd * 7 + gqa), 60.0f);  // a chunk of prefill
      }
}

TEST_CASE("quantized attention handles narrow and odd heads", "[attention]") {
  using fd::kernels::KvDtype;
  for (int len : {1, 7, 33, 100}) {
    check_quant_case(KvDtype::q8, len, 8, 2, std::min(len, 3), 16, uint32_t(len));  // stories260K
    check_quant_case(KvDtype::q8, len, 20, 1, 1, 5, uint32_t(len + 1));            // no vector path
    // q8 blocks of 40 tokens end in a key group of 8; head_dim 48 ends in a value chunk of 16,
    // head_dim 24 is one chunk of 24 (narrow vectors).
    check_quant_case(KvDtype::q8, len, 48, 4, 1, 40, uint32_t(len + 4));
    check_quant_case(KvDtype::q8, len, 24, 2, std::min(len, 2), 40, uint32_t(len + 5));
    check_quant_case(KvDtype::q4, len, 32, 4, 1, 5, uint32_t(len + 2));
    check_quant_case(KvDtype::q4, len, 256, 3, std::min(len, 2), 48, uint32_t(len + 3));
  }
}

TEST_CASE("quantized attention gives the same answer on every SIMD target", "[attention]") {
  using fd::kernels::KvDtype;
  // q8 with head_dim 48 and blocks of 40: a partial key group and a partial value chunk.
  for (auto [dt, hd, bt] : {std::tuple{KvDtype::q8, 64, 16}, {KvDtype::q8, 8, 16}, {KvDtype::q8, 128, 16},
                            {KvDtype::q8, 48, 40}, {KvDtype::q4, 32, 16}, {KvDtype::q4, 64, 16},
                            {KvDtype::q4, 128, 16}}) {
    const QuantKv kv(dt, 2, hd, bt, 50, 31);
    const auto q = random_q(size_t(3) * 8 * hd, 2.0f, 32);
    std::vector<double> ref, tol;
    reference_scaled(transformed_q(q, hd, dt), 3, 47, kv.decoded(), 8, ref, tol);
    const auto weights = weight_rounding_sigma(dt, transformed_q(q, hd, dt), 3, 47, kv.decoded(), 8);
    for (size_t i = 0; i < tol.size(); ++i) tol[i] += 6 * weights[i];
    for_each_kernel_target([&](int64_t target) {
      INFO("target " << hwy::TargetName(target) << " " << fd::kernels::kv_dtype_name(dt) << " hd " << hd);
      std::vector<float> out(q.size());
      fd::kernels::attention(q.data(), 3, 47, kv.view(), {8, 2, hd}, out.data());
      size_t bad = 0;
      for (size_t i = 0; i < out.size(); ++i) bad += !(std::fabs(out[i] - ref[i]) <= tol[i]);
      CHECK(bad == 0);
    });
  }
}

// A KvBlocks' blocks (kApart) copied into the kSideBySide layout: block b holds each kv head's K
// head block followed by its V head block.
struct SideBySideCopy {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<const uint8_t*> kp, vp;
  fd::kernels::KvBlocks kv;
  SideBySideCopy(const fd::kernels::KvBlocks& apart, int n_kv_heads, int head_dim) : kv(apart) {
    const size_t hb = fd::kernels::kv_format(apart.dtype).head_block_bytes(apart.block_tokens, head_dim);
    const size_t n = size_t((apart.len + apart.block_tokens - 1) / apart.block_tokens);
    for (size_t b = 0; b < n; ++b) {
      auto& blk = blocks.emplace_back(2 * size_t(n_kv_heads) * hb);
      for (int h = 0; h < n_kv_heads; ++h) {
        std::memcpy(blk.data() + 2 * size_t(h) * hb, apart.k[b] + size_t(h) * hb, hb);
        std::memcpy(blk.data() + (2 * size_t(h) + 1) * hb, apart.v[b] + size_t(h) * hb, hb);
      }
    }
    for (auto& blk : blocks) {
      kp.push_back(blk.data());
      vp.push_back(blk.data() + hb);
    }
    kv.k = kp.data();
    kv.v = vp.data();
    kv.layout = fd::kernels::KvLayout::kSideBySide;
  }
};

TEST_CASE("attention over kv heads laid side by side matches the heads apart bit for bit on every SIMD target",
          "[attention]") {
  using fd::kernels::KvDtype;
  // Decode and prefill; GQA 1 to 8; blocks of 16, 5 and 64 tokens; a partial last block.
  for (KvDtype dt : {KvDtype::f16, KvDtype::q8, KvDtype::q4})
    for (auto [hd, gqa, n_q, len, bt] : {std::tuple{64, 1, 1, 100, 16}, {128, 4, 3, 70, 16}, {64, 8, 1, 33, 5},
                                         {128, 2, 1, 200, 64}, {64, 4, 9, 9, 16}}) {
      const int nkv = 2, n_heads = nkv * gqa;
      const QuantKv apart(dt, nkv, hd, bt, len, uint32_t(hd + gqa + len));
      const SideBySideCopy side(apart.view(), nkv, hd);
      const auto q = random_q(size_t(n_q) * n_heads * hd, 2.0f, uint32_t(len));
      const fd::kernels::AttnDims d{n_heads, nkv, hd};
      for_each_kernel_target([&](int64_t target) {
        INFO("target " << hwy::TargetName(target) << " " << fd::kernels::kv_dtype_name(dt) << " hd " << hd
                       << " gqa " << gqa << " n_q " << n_q << " len " << len << " bt " << bt);
        std::vector<float> a(q.size()), b(q.size(), -1.0f);
        fd::kernels::attention(q.data(), n_q, len - n_q, apart.view(), d, a.data());
        fd::kernels::attention(q.data(), n_q, len - n_q, side.kv, d, b.data());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        if (dt != KvDtype::f16) return;
        // The fp16 entry point reads the same layout.
        std::vector<const uint16_t*> k16, v16;
        for (size_t i = 0; i < side.kp.size(); ++i) {
          k16.push_back(reinterpret_cast<const uint16_t*>(side.kp[i]));
          v16.push_back(reinterpret_cast<const uint16_t*>(side.vp[i]));
        }
        const fd::kernels::KvBlocksF16 kv16{k16.data(), v16.data(), bt, len, fd::kernels::KvLayout::kSideBySide};
        std::fill(b.begin(), b.end(), -1.0f);
        fd::kernels::attention_f16(q.data(), n_q, len - n_q, kv16, d, b.data());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      });
    }
}

TEST_CASE("a NaN in one query head makes that head's output NaN and no other head's on every SIMD target",
          "[attention]") {
  using fd::kernels::KvDtype;
  for (auto [dt, hd] : {std::pair{KvDtype::f16, 64}, {KvDtype::q8, 64}, {KvDtype::q8, 20}, {KvDtype::q4, 64},
                        {KvDtype::q4, 32}}) {
    const QuantKv kv(dt, 2, hd, 16, 50, 7);
    auto q = random_q(size_t(8) * hd, 2.0f, 8);
    q[size_t(1) * hd + 5] = std::numeric_limits<float>::quiet_NaN();  // head 1 (kv head 0)
    for_each_kernel_target([&](int64_t target) {
      INFO("target " << hwy::TargetName(target) << " " << fd::kernels::kv_dtype_name(dt) << " hd " << hd);
      std::vector<float> out(q.size());
      fd::kernels::attention(q.data(), 1, 49, kv.view(), {8, 2, hd}, out.data());
      for (int h = 0; h < 8; ++h) {
        INFO("head " << h);
        size_t nan = 0;
        for (int i = 0; i < hd; ++i) nan += std::isnan(out[size_t(h) * hd + i]);
        CHECK(nan == (h == 1 ? size_t(hd) : 0));
      }
    });
  }
}

TEST_CASE("a NaN in one cached K or V row makes the outputs it reaches NaN and no others on every SIMD target",
          "[attention]") {
  using fd::kernels::KvDtype;
  const int hd = 64, bt = 16, len = 50;
  for (KvDtype dt : {KvDtype::f16, KvDtype::q8, KvDtype::q4})
    for (auto part : {fd::kernels::KvPart::key, fd::kernels::KvPart::value}) {
      QuantKv kv(dt, 2, hd, bt, len, 11);
      const auto& f = fd::kernels::kv_format(dt);
      std::vector<uint16_t> row(hd, 0x3C00);  // 1.0
      row[7] = 0x7E00;                         // NaN
      // Token 49, kv head 0, in the block that is not full (f16 keys are written row by row there).
      auto& block = part == fd::kernels::KvPart::key ? kv.kb[size_t(49 / bt)] : kv.vb[size_t(49 / bt)];
      REQUIRE(size_t(49 / bt + 1) * bt > size_t(len));
      f.encode_row(part, row.data(), hd, bt, 49 % bt, block.data());
      // A NaN key reaches every output of the heads that read it through the softmax; a value,
      // the elements where its decoded row is NaN (f16: one; q8: all; q4: its scale group's).
      std::vector<float> decoded(hd);
      f.decode_row(part, block.data(), hd, bt, 49 % bt, decoded.data());
      size_t reached = 0;
      for (float x : decoded) reached += std::isnan(x);
      if (part == fd::kernels::KvPart::key) reached = size_t(hd);
      const auto q = random_q(size_t(8) * hd, 2.0f, 12);
      for_each_kernel_target([&](int64_t target) {
        INFO("target " << hwy::TargetName(target) << " " << f.name()
                       << (part == fd::kernels::KvPart::key ? " key" : " value"));
        std::vector<float> out(q.size());
        fd::kernels::attention(q.data(), 1, len - 1, kv.view(), {8, 2, hd}, out.data());
        for (int h = 0; h < 8; ++h) {
          INFO("head " << h);
          size_t nan = 0;
          for (int i = 0; i < hd; ++i) nan += std::isnan(out[size_t(h) * hd + i]);
          CHECK(nan == (h < 4 ? reached : 0));  // heads 0-3 read kv head 0
        }
      });
    }
}

namespace {

// attention_batch_f16 over the fp16 originals of seqs (row counts n_qs, queries q) gives expect.
void check_batch_f16(const std::vector<QuantKv>& seqs, const std::vector<int>& n_qs,
                     const std::vector<std::vector<float>>& q, const std::vector<std::vector<float>>& expect,
                     const fd::kernels::AttnDims& d, fd::kernels::ThreadPool& pool) {
  std::vector<std::vector<float>> out(seqs.size());
  std::vector<fd::kernels::AttnItemF16> items16;
  for (size_t s = 0; s < seqs.size(); ++s) {
    out[s].assign(q[s].size(), -7.0f);
    items16.push_back({q[s].data(), out[s].data(), n_qs[s], seqs[s].len - n_qs[s], seqs[s].src.view()});
  }
  fd::kernels::attention_batch_f16(items16.data(), items16.size(), d, pool);
  for (size_t s = 0; s < seqs.size(); ++s) CHECK(out[s] == expect[s]);
}

}  // namespace

TEST_CASE("attention_batch matches per-sequence attention bit for bit at any thread count", "[attention]") {
  using fd::kernels::KvDtype;
  const int n_kv = 4, hd = 64, gqa = 2, n_heads = n_kv * gqa;
  const fd::kernels::AttnDims d{n_heads, n_kv, hd};
  for (KvDtype dt : {KvDtype::f16, KvDtype::q8, KvDtype::q4}) {
    std::vector<QuantKv> seqs;
    std::vector<int> n_qs;
    for (int s = 0; s < 9; ++s) {
      seqs.emplace_back(dt, n_kv, hd, 16, 5 + 37 * s, uint32_t(100 + s));
      n_qs.push_back(s % 3 == 0 ? 3 : 1);
    }
    const size_t qw = size_t(n_heads) * hd;
    std::vector<std::vector<float>> q, expect;
    for (size_t s = 0; s < seqs.size(); ++s) {
      q.push_back(random_q(qw * n_qs[s], 2.0f, uint32_t(s)));
      expect.emplace_back(q.back().size());
      fd::kernels::attention(q[s].data(), n_qs[s], seqs[s].len - n_qs[s], seqs[s].view(), d, expect[s].data());
    }
    for (int threads : {1, 2, 3, 5}) {
      INFO("threads " << threads << " dtype " << fd::kernels::kv_dtype_name(dt));
      fd::kernels::ThreadPool pool(threads);
      CHECK(pool.threads() == threads);
      std::vector<std::vector<float>> out(seqs.size());
      std::vector<fd::kernels::AttnItem> items;
      for (size_t s = 0; s < seqs.size(); ++s) {
        out[s].assign(q[s].size(), -7.0f);
        items.push_back({q[s].data(), out[s].data(), n_qs[s], seqs[s].len - n_qs[s], seqs[s].view()});
      }
      for (int rep = 0; rep < 3; ++rep) {  // the pool is reused across calls
        fd::kernels::attention_batch(items.data(), items.size(), d, pool);
        for (size_t s = 0; s < seqs.size(); ++s) CHECK(out[s] == expect[s]);
      }
      if (dt == KvDtype::f16) check_batch_f16(seqs, n_qs, q, expect, d, pool);
    }
  }
}

TEST_CASE("attention_batch cuts a long prefill into row ranges and still matches attention bit for bit",
          "[attention]") {
  using fd::kernels::KvDtype;
  // GQA 3: a tile of 8 query vectors spans parts of three rows, so only cuts at multiples of
  // kUnitRowAlign rows keep every tile whole.
  for (const auto& [n_kv, gqa] : {std::pair{1, 3}, std::pair{2, 4}}) {
    const int hd = 64, n_heads = n_kv * gqa;
    const fd::kernels::AttnDims d{n_heads, n_kv, hd};
    for (KvDtype dt : {KvDtype::f16, KvDtype::q8, KvDtype::q4}) {
      // A 205-row prompt at positions [95, 300), then three decoding sequences.
      std::vector<QuantKv> seqs;
      std::vector<int> n_qs{205, 1, 1, 1};
      for (int len : {300, 40, 77, 129}) seqs.emplace_back(dt, n_kv, hd, 64, len, uint32_t(len));
      const size_t qw = size_t(n_heads) * hd;
      std::vector<std::vector<float>> q, expect;
      std::vector<fd::kernels::AttnItem> items;
      for (size_t s = 0; s < seqs.size(); ++s) {
        q.push_back(random_q(qw * n_qs[s], 2.0f, uint32_t(7 + s)));
        expect.emplace_back(q.back().size());
        fd::kernels::attention(q[s].data(), n_qs[s], seqs[s].len - n_qs[s], seqs[s].view(), d, expect[s].data());
      }
      for (int threads : {1, 2, 3, 5}) {
        INFO("kv heads " << n_kv << " gqa " << gqa << " dtype " << fd::kernels::kv_dtype_name(dt) << " threads "
                         << threads);
        std::vector<std::vector<float>> out(seqs.size());
        items.clear();
        for (size_t s = 0; s < seqs.size(); ++s) {
          out[s].assign(q[s].size(), -7.0f);
          items.push_back({q[s].data(), out[s].data(), n_qs[s], seqs[s].len - n_qs[s], seqs[s].view()});
        }
        const auto units = fd::kernels::plan_attention_units(items.data(), items.size(), n_kv, threads);
        size_t cut = 0;
        for (const auto& u : units) cut += u.item == 0 && u.row_begin > 0;
        CHECK((threads == 1 ? cut == 0 : cut > 0));  // else this would not test the cut
        fd::kernels::ThreadPool pool(threads);
        fd::kernels::attention_batch(items.data(), items.size(), d, pool);
        for (size_t s = 0; s < seqs.size(); ++s) CHECK(out[s] == expect[s]);
        if (dt == KvDtype::f16) check_batch_f16(seqs, n_qs, q, expect, d, pool);
      }
    }
  }
}

TEST_CASE("attention_batch cuts a few decoding sequences' keys into block ranges and merges them on every SIMD target",
          "[attention]") {
  using fd::kernels::KvDtype;
  const int hd = 64, gqa = 4;
  for (int n_kv : {1, 2}) {
    const int n_heads = n_kv * gqa;
    const fd::kernels::AttnDims d{n_heads, n_kv, hd};
    const size_t qw = size_t(n_heads) * hd;
    for (KvDtype dt : {KvDtype::f16, KvDtype::q8, KvDtype::q4}) {
      // A row at the end of 2100 keys (the last block partly filled) and one at key 2090 of 2200
      // (its last visible block sealed, with keys beyond the row): ranges of kMinKeyRange keys
      // or more, so two or three per kv head.
      std::vector<QuantKv> seqs;
      seqs.emplace_back(dt, n_kv, hd, 64, 2100, 11u);
      seqs.emplace_back(dt, n_kv, hd, 64, 2200, 12u);
      const std::vector<int> pos{2099, 2090};
      std::vector<std::vector<float>> q;
      for (size_t s = 0; s < seqs.size(); ++s) q.push_back(random_q(qw, 2.0f, uint32_t(31 + s)));
      q[1][size_t(n_heads - 1) * hd + 3] = std::numeric_limits<float>::quiet_NaN();  // the last query head
      for_each_kernel_target([&](int64_t target) {
        std::vector<std::vector<float>> expect;
        for (size_t s = 0; s < seqs.size(); ++s) {
          expect.emplace_back(qw);
          fd::kernels::attention(q[s].data(), 1, pos[s], seqs[s].view(), d, expect[s].data());
        }
        for (int threads : {2 * n_kv + 1, 8}) {  // more threads than the 2 * n_kv (item, kv head) units
          INFO("target " << hwy::TargetName(target) << " kv heads " << n_kv << " dtype "
                         << fd::kernels::kv_dtype_name(dt) << " threads " << threads);
          std::vector<std::vector<float>> out(seqs.size(), std::vector<float>(qw, -7.0f));
          std::vector<fd::kernels::AttnItem> items;
          for (size_t s = 0; s < seqs.size(); ++s)
            items.push_back({q[s].data(), out[s].data(), 1, pos[s], seqs[s].view()});
          size_t ranges = 0;
          for (const auto& u : fd::kernels::plan_attention_units(items.data(), items.size(), n_kv, threads))
            ranges += u.key_end > 0;
          CHECK(ranges > size_t(2 * n_kv));  // else this would not test the cut
          fd::kernels::ThreadPool pool(threads);
          fd::kernels::attention_batch(items.data(), items.size(), d, pool);
          // One pass and the merged ranges differ only in fp32 rounding: the weights' integers of
          // the quantized formats are rounded per tile, and tiles do not cross blocks. Each output
          // is a convex combination of values within +-1, so the rounding moves it by a few fp32
          // ulp of 1 per fold step (a few hundred at most).
          size_t bad = 0, nan_ok = 0;
          for (size_t s = 0; s < seqs.size(); ++s)
            for (size_t i = 0; i < qw; ++i) {
              if (std::isnan(expect[s][i])) {
                nan_ok += std::isnan(out[s][i]);
                continue;
              }
              bad += !(std::fabs(out[s][i] - expect[s][i]) <= 2e-5f);
            }
          CHECK(bad == 0);
          CHECK(nan_ok == size_t(hd));  // the NaN query head's outputs, and no other's
        }
      });
    }
  }
}

TEST_CASE("ThreadPool runs every item once and reports a failing item", "[attention]") {
  for (int threads : {1, 2, 4}) {
    fd::kernels::ThreadPool pool(threads);
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1000)}) {
      std::vector<std::atomic<int>> hits(n);
      pool.run(n, [&](size_t i) { hits[i].fetch_add(1); });
      size_t once = 0;
      for (auto& h : hits) once += h.load() == 1;
      CHECK(once == n);
    }
    std::atomic<int> ran{0};
    CHECK_THROWS_WITH(pool.run(50,
                               [&](size_t i) {
                                 ran.fetch_add(1);
                                 if (i == 17) throw std::runtime_error("item 17 failed");
                               }),
                      "item 17 failed");
    CHECK(ran.load() == 50);  // the other items still ran
    std::atomic<int> after{0};
    pool.run(3, [&](size_t) { after.fetch_add(1); });  // still usable after a failure
    CHECK(after.load() == 3);
  }
}

TEST_CASE("BlockVisits reads block-major and names the visits it fetches ahead", "[attention]") {
  // Tiles reading 3, 1, 0 and 2 blocks: block 0 of tiles 0, 1, 3, then block 1 of 0 and 3, then
  // block 2 of 0.
  const size_t blocks[4] = {3, 1, 0, 2};
  const std::vector<std::pair<int, size_t>> order = {{0, 0}, {1, 0}, {3, 0}, {0, 1}, {3, 1}, {0, 2}};
  for (int lookahead : {1, 2, 9}) {
    INFO("lookahead " << lookahead);
    size_t k = 0;
    for (fd::kernels::BlockVisits v(blocks, 4, lookahead); v.Next();) {
      INFO("visit " << k);
      REQUIRE(k < order.size());
      CHECK(std::make_pair(v.tile(), v.block()) == order[k]);
      if (k + lookahead < order.size()) {
        CHECK(std::make_pair(v.ahead_tile(), v.ahead_block()) == order[k + lookahead]);
      } else {
        CHECK(v.ahead_tile() < 0);
      }
      ++k;
    }
    CHECK(k == order.size());
  }
  const size_t none[2] = {0, 0};
  int visits = 0;
  for (fd::kernels::BlockVisits v(none, 2, 1); v.Next();) ++visits;
  CHECK(visits == 0);
  const size_t one[1] = {1};  // a single visit, nothing ahead of it
  fd::kernels::BlockVisits v(one, 1, 1);
  REQUIRE(v.Next());
  CHECK((v.tile() == 0 && v.block() == 0 && v.ahead_tile() < 0));
  CHECK_FALSE(v.Next());
}
