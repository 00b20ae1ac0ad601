// Decode and prefill attention over the quantized KV formats (layouts in kernels/kv_format.h).
// Keys are scored with exact integer dot products against a quantized query, and values are
// summed with integer dot products over four keys against rounded weights, so that a key costs a
// few integer instructions per 64 bytes on each side. Built with -fno-tree-pre (CMakeLists.txt).

// Highway 1.0 builds its AVX3_DL target (AVX-512 with VNNI) only on request; this file alone
// asks, for VNNI's four-byte dot products. Dispatch is per translation unit.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/attention_tile.h"
#include "kernels/kv_format.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_quant.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "kernels/attention-inl.h"
#include "kernels/f16-inl.h"

#ifndef FD_KERNELS_ATTENTION_QUANT_ONCE_
#define FD_KERNELS_ATTENTION_QUANT_ONCE_
namespace fd::kernels {
namespace {

constexpr int kTileT = kWeightTileKeys;  // keys scored per softmax step
constexpr int kMaxHeadDim = 256;
// K and V bytes fetched ahead of the kernel, in visits of one kv head's block (one at least):
// q4 hd64 (4.5 KiB of K and V a visit at 64-token blocks) two visits ahead, larger heads one. AMD
// EPYC (Zen 5), from memory (ctx 4096, batch 16, 4 layers), one build switching between passes,
// median ratio of adjacent passes (8-12 pairs), two visits ahead against one:
// - one thread: q4 hd64 GQA 1 1.112x as fast, GQA 2 1.201x, GQA 4 1.085x (ctx 512 batch 64
//   1.055x), GQA 8 1.010x; q4 hd128 GQA 1 0.955x and GQA 4 0.972x, q8 hd64 0.975x and 1.046x, q8
//   hd128 0.924x and 0.932x, so those keep one; KV in cache (q4 hd64 GQA 4) 0.986x.
// - 2 threads (stream at 32-36 GB/s): q4 hd64 GQA 4 1.038x, batch 64 1.030x, ctx 512 batch 64
//   1.035x; GQA 1 1.044x, 1.020x and 1.070x.
// (6 KiB, one visit for all, had been measured best at 2-3 visits of q4 and q8 hd128 when each
// head was walked alone, before the block-major order.)
constexpr size_t kPrefetchBytes = 12288;
// q8 queries are int8, as VNNI's byte products take them (ScoreSealedPassQ8). Against int16
// queries (32767 levels), q8 attention's rms error against fp64 over the fp16 K/V grew 1.04-1.08x
// (hd64/128, 1000 keys, Gaussian K/V, with and without 4 outlier channels of 8x).
constexpr float kQ8Levels = 127.0f;
constexpr float kQ4Levels = 127.0f;    // q4 queries are int8 (u8 x i8 pair sums fit int16)


// A query with a NaN or an infinity: integers 0 and a NaN scale, so that its scores, and so its
// output, are NaN on every target, as with fp16 KV (a max over the query would drop the NaN).
float NonFiniteQuery(size_t hd, int32_t* qi) {
  std::fill(qi, qi + hd, 0);
  return std::numeric_limits<float>::quiet_NaN();
}

// The query transform of the quantized formats: x = q * fl(1/sqrt(head_dim)) in fp32, rounded to
// integers qi in [-levels, levels] with one scale per vector; returns the scale (x ~ qi * scale).
float QuantizeQueryInts(const float* q, size_t hd, float levels, int32_t* qi) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float x[kMaxHeadDim];
  float amax = 0.0f;
  for (size_t c = 0; c < hd; ++c) {
    x[c] = q[c] * scale;
    if (!std::isfinite(x[c])) return NonFiniteQuery(hd, qi);
    amax = std::max(amax, std::fabs(x[c]));
  }
  const float qscale = amax / levels;
  const float inv = qscale > 0.0f ? 1.0f / qscale : 0.0f;
  // |x * inv| <= levels < 2^22: adding and subtracting 1.5 * 2^23 rounds to nearest even, as
  // nearbyint does, without its library call per element (this loop was 9 % of int4 attention
  // at ctx 512). This code is built for the baseline target, which has no FMA to fuse it.
  constexpr float kRound = 12582912.0f;
  for (size_t c = 0; c < hd; ++c) {
    const float y = x[c] * inv;
    qi[c] = static_cast<int32_t>(std::clamp((y + kRound) - kRound, -levels, levels));
  }
  return qscale;
}

// Plain attention over decoded rows with the same query transform: for the SCALAR target and for
// q8 heads whose head_dim is not a multiple of 8.
void AttendTileScalar(const Tile& tile, const KvBlocks& kv, size_t head_bytes, int kv_head,
                      int head_dim) {
  const KvFormat& f = kv_format(kv.dtype);
  const size_t hd = static_cast<size_t>(head_dim);
  const size_t off = static_cast<size_t>(kv_head) * kv_head_stride(kv.layout, head_bytes);
  const float levels = kv.dtype == KvDtype::q4 ? kQ4Levels : kQ8Levels;
  float k[kMaxHeadDim], v[kMaxHeadDim];
  // Key row t into k: the q8 keys of a full block are transposed (sealed).
  const auto key_row = [&](int t) {
    const int b = t / kv.block_tokens, tb = t % kv.block_tokens;
    const uint8_t* hb = kv.k[b] + off;
    if (kv.dtype == KvDtype::q4) return f.decode_row(KvPart::key, hb, head_dim, kv.block_tokens, tb, k);
    const bool sealed = (b + 1) * kv.block_tokens <= kv.len && detail::q8_seals_keys(hd);
    detail::q8_decode_key_row(hb, sealed, hd, static_cast<size_t>(kv.block_tokens), static_cast<size_t>(tb), k);
  };
  for (int j = 0; j < tile.n; ++j) {
    int32_t qi[kMaxHeadDim];
    const float qscale = QuantizeQueryInts(tile.q[j], hd, levels, qi);
    std::vector<float> s(static_cast<size_t>(tile.limit[j]));
    float m = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < tile.limit[j]; ++t) {
      key_row(t);
      float dot = 0.0f;
      for (size_t c = 0; c < hd; ++c) dot += static_cast<float>(qi[c]) * k[c];
      s[static_cast<size_t>(t)] = dot * qscale;
      m = std::max(m, dot * qscale);
    }
    float acc[kMaxHeadDim] = {}, l = 0.0f;
    for (int t = 0; t < tile.limit[j]; ++t) {
      const int b = t / kv.block_tokens;
      f.decode_row(KvPart::value, kv.v[b] + off, head_dim, kv.block_tokens, t % kv.block_tokens, v);
      const float p = std::exp(s[static_cast<size_t>(t)] - m);
      l += p;
      for (size_t c = 0; c < hd; ++c) acc[c] += p * v[c];
    }
    for (size_t c = 0; c < hd; ++c) tile.out[j][c] = acc[c] / l;
    StoreStats(tile, j, m, l);
  }
}

}  // namespace
}  // namespace fd::kernels
#endif  // FD_KERNELS_ATTENTION_QUANT_ONCE_

HWY_BEFORE_NAMESPACE();
namespace fd::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
HWY_INLINE __m128i MaddUbs(__m128i a, __m128i b) { return _mm_maddubs_epi16(a, b); }
HWY_INLINE __m128i MaddOnes(__m128i a) { return _mm_madd_epi16(a, _mm_set1_epi16(1)); }
HWY_INLINE __m128i Madd16(__m128i a, __m128i b) { return _mm_madd_epi16(a, b); }
#if HWY_TARGET <= HWY_AVX2
HWY_INLINE __m256i MaddUbs(__m256i a, __m256i b) { return _mm256_maddubs_epi16(a, b); }
HWY_INLINE __m256i MaddOnes(__m256i a) { return _mm256_madd_epi16(a, _mm256_set1_epi16(1)); }
HWY_INLINE __m256i Madd16(__m256i a, __m256i b) { return _mm256_madd_epi16(a, b); }
#endif
#if HWY_TARGET <= HWY_AVX3
HWY_INLINE __m512i MaddUbs(__m512i a, __m512i b) { return _mm512_maddubs_epi16(a, b); }
HWY_INLINE __m512i MaddOnes(__m512i a) { return _mm512_madd_epi16(a, _mm512_set1_epi16(1)); }
HWY_INLINE __m512i Madd16(__m512i a, __m512i b) { return _mm512_madd_epi16(a, b); }
#endif
#undef FD_X86_MADD
#define FD_X86_MADD 1
#else
#undef FD_X86_MADD
#define FD_X86_MADD 0
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
// Unsigned saturating packs within 128-bit lanes: int32 to uint16, and int16 to uint8.
HWY_INLINE __m128i PackWords(__m128i a, __m128i b) { return _mm_packus_epi32(a, b); }
HWY_INLINE __m128i PackBytes(__m128i a, __m128i b) { return _mm_packus_epi16(a, b); }
#if HWY_TARGET <= HWY_AVX2
HWY_INLINE __m256i PackWords(__m256i a, __m256i b) { return _mm256_packus_epi32(a, b); }
HWY_INLINE __m256i PackBytes(__m256i a, __m256i b) { return _mm256_packus_epi16(a, b); }
#endif
#if HWY_TARGET <= HWY_AVX3
HWY_INLINE __m512i PackWords(__m512i a, __m512i b) { return _mm512_packus_epi32(a, b); }
HWY_INLINE __m512i PackBytes(__m512i a, __m512i b) { return _mm512_packus_epi16(a, b); }
#endif
#endif

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3_DL
// int32 lane i of acc += sum over k < 4 of a[4i+k] * b[4i+k], bytes a unsigned, b signed:
// AVX512_VNNI's vpdpbusd, which Highway's runtime check for AVX3_DL requires of the CPU. In
// assembly because Highway 1.0's flags for the target name avxvnni (the VEX form, which that
// check does not cover) instead of avx512vnni; {evex} keeps the 128/256-bit forms off VEX.
template <class V>
HWY_INLINE V DotBytes(V acc, V a, V b) {
  asm("%{evex%} vpdpbusd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
  return acc;
}
// int32 lane i of acc += a[2i] * b[2i] + a[2i+1] * b[2i+1], int16 a and b (vpdpwssd).
template <class V>
HWY_INLINE V DotWords(V acc, V a, V b) {
  asm("%{evex%} vpdpwssd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
  return acc;
}
// Bytes of q4 values, two nibbles each, as the signed bytes the value sums take: the low nibble
// - 8 by one vpermb over a table of (i & 15) - 8 (the index bits beyond the table are ignored),
// and 16 * (high nibble - 8) = (b & 0xF0) ^ 0x80 by one vpternlogd, whose sums are then 16 times
// the high nibbles'. Shifting, masking and subtracting took five instructions for the two, against
// 16 vpdpbusd at GQA 4: Intel Xeon (AVX-512 VNNI), one core, KV in L2, medians of 6 alternating
// runs, q4 hd64 GQA 4 12.9 -> 13.5 GB/s, GQA 1 20.4 -> 21.6.
HWY_INLINE __m128i NibbleTable() {
  return _mm_set_epi64x(0x0706050403020100LL, static_cast<long long>(0xFFFEFDFCFBFAF9F8ULL));
}
HWY_INLINE __m128i LowNibblesLess8(__m128i b) { return _mm_permutexvar_epi8(b, NibbleTable()); }
HWY_INLINE __m256i LowNibblesLess8(__m256i b) {
  return _mm256_permutexvar_epi8(b, _mm256_broadcastsi128_si256(NibbleTable()));
}
HWY_INLINE __m512i LowNibblesLess8(__m512i b) {
  return _mm512_permutexvar_epi8(b, _mm512_broadcast_i32x4(NibbleTable()));
}
HWY_INLINE __m128i HighNibblesLess8x16(__m128i b) {
  return _mm_ternarylogic_epi32(b, _mm_set1_epi8(-16), _mm_set1_epi8(-128), 0x6A);  // (b & 0xF0) ^ 0x80
}
HWY_INLINE __m256i HighNibblesLess8x16(__m256i b) {
  return _mm256_ternarylogic_epi32(b, _mm256_set1_epi8(-16), _mm256_set1_epi8(-128), 0x6A);
}
HWY_INLINE __m512i HighNibblesLess8x16(__m512i b) {
  return _mm512_ternarylogic_epi32(b, _mm512_set1_epi8(-16), _mm512_set1_epi8(-128), 0x6A);
}
// The q4 keys' high nibbles, (b >> 4) & 15 per byte, in one vgf2p8affineqb (KeyHighNibbles)
// instead of a shift of words and a mask. GFNI is not among the extensions Highway checks for
// this target, so KeyNibblesByGfni checks it at run time. Intel Xeon (AVX-512 VNNI), 2 threads,
// two builds in one process, median ratios of 120-300 adjacent passes: int4 hd64 GQA 1 1.035x as
// fast with the KV in cache and 1.018x from memory, hd128 GQA 1 1.011x, hd64 GQA 4 1.003-1.009x.
// AffineBytes maps each byte of b by the 8x8 bit matrices m (one per 8 bytes) over GF(2).
template <class V>
HWY_INLINE V AffineBytes(V b, V m) {
  V r;
  asm("vgf2p8affineqb $0, %[m], %[b], %[r]" : [r] "=v"(r) : [m] "v"(m), [b] "v"(b));
  return r;
}
HWY_INLINE bool KeyNibblesByGfni() { return __builtin_cpu_supports("gfni"); }
#undef FD_X86_VNNI
#define FD_X86_VNNI 1
#else
HWY_INLINE bool KeyNibblesByGfni() { return false; }
#undef FD_X86_VNNI
#define FD_X86_VNNI 0
#endif

// b >> 4 per byte (the q4 keys' high nibbles), by AffineBytes where kGfni: its matrix's row for
// result bit i picks bit i + 4.
template <bool kGfni, class V8>
HWY_INLINE V8 KeyHighNibbles(V8 b) {
#if FD_X86_VNNI
  if constexpr (kGfni) {
    const hn::Repartition<int64_t, hn::DFromV<V8>> d64;
    return V8{AffineBytes(b.raw, hn::BitCast(hn::DFromV<V8>(), hn::Set(d64, 0x1020408000000000LL)).raw)};
  }
#endif
  return hn::ShiftRight<4>(b);
}

// q4 value sums kept in int16 (AccumulateQuadsQ4), which bounds the quads summed per call.
#undef FD_Q4_INT16_SUMS
#define FD_Q4_INT16_SUMS (FD_X86_MADD && !FD_X86_VNNI)

// int16 lane i = a[2i] * b[2i] + a[2i+1] * b[2i+1] for unsigned bytes a and signed b whose pair
// sums fit int16 (pmaddubsw saturates): q4 keys, a in [0, 15] and int8 b (2 * 15 * 127 < 2^15);
// q4 values, a in [0, 255] and b in [-8, 7] (2 * 255 * 8 < 2^15).
template <class D8>
HWY_INLINE hn::Vec<hn::Repartition<int16_t, D8>> MulPairs(D8, hn::Vec<D8> a,
                                                         hn::Vec<hn::RebindToSigned<D8>> b) {
  const hn::Repartition<int16_t, D8> d16;
#if FD_X86_MADD
  return hn::Vec<decltype(d16)>{MaddUbs(a.raw, b.raw)};
#else
  const hn::Repartition<uint16_t, D8> du16;
  const auto b16 = hn::BitCast(d16, b);
  const auto ae = hn::BitCast(d16, hn::And(hn::BitCast(du16, a), hn::Set(du16, 0xFF)));
  const auto ao = hn::BitCast(d16, hn::ShiftRight<8>(hn::BitCast(du16, a)));
  const auto be = hn::ShiftRight<8>(hn::ShiftLeft<8>(b16));
  const auto bo = hn::ShiftRight<8>(b16);
  return hn::Add(hn::Mul(ae, be), hn::Mul(ao, bo));
#endif
}

// int32 lane i = v[2i] + v[2i+1].
template <class D32>
HWY_INLINE hn::Vec<D32> SumPairs(D32 d32, hn::Vec<hn::Repartition<int16_t, D32>> v) {
#if FD_X86_MADD
  (void)d32;
  return hn::Vec<D32>{MaddOnes(v.raw)};
#else
  const auto w = hn::BitCast(d32, v);
  return hn::Add(hn::ShiftRight<16>(hn::ShiftLeft<16>(w)), hn::ShiftRight<16>(w));
#endif
}

// int32 lane i of acc += sum over k < 4 of w[4i+k] * v[4i+k], for the bytes of w unsigned and
// those of v signed (exact: 4 * 255 * 128 fits easily). kW7: every w is at most 127, so that the
// pair sums of pmaddubsw fit int16 (2 * 127 * 127 < 2^15), which is what the x86 targets without
// VNNI require (q4 sums its larger weights in int16 there instead, AccumulateQuadsQ4).
template <bool kW7 = false, class D32>
HWY_INLINE hn::Vec<D32> DotQuads(D32 d32, hn::Vec<D32> acc, hn::Vec<D32> w, hn::Vec<D32> v) {
#if FD_X86_VNNI
  (void)d32;
  return hn::Vec<D32>{DotBytes(acc.raw, w.raw, v.raw)};
#elif FD_X86_MADD
  static_assert(kW7, "without VNNI, pmaddubsw's pair sums fit int16 only for weights up to 127");
  return hn::Add(acc, hn::Vec<D32>{MaddOnes(MaddUbs(w.raw, v.raw))});
#else
  const auto m = hn::Set(d32, 0xFF);
  acc = hn::Add(acc, hn::Mul(hn::And(w, m), hn::ShiftRight<24>(hn::ShiftLeft<24>(v))));
  acc = hn::Add(acc, hn::Mul(hn::And(hn::ShiftRight<8>(w), m), hn::ShiftRight<24>(hn::ShiftLeft<16>(v))));
  acc = hn::Add(acc, hn::Mul(hn::And(hn::ShiftRight<16>(w), m), hn::ShiftRight<24>(hn::ShiftLeft<8>(v))));
  return hn::Add(acc, hn::Mul(hn::And(hn::ShiftRight<24>(w), m), hn::ShiftRight<24>(v)));
#endif
}

// A query vector as the format scores it: scaled by 1/sqrt(head_dim), rounded to integers with
// one scale per vector (qscale = max|q| / levels). One type per format, so that a tile's queries
// hold only what their format reads (a group of tiles keeps up to kMaxGroupQ of them). The
// scoring stores raw scores, qscale left out, and FoldTileToWeights scales them in the multiply-add
// its exponential needs anyway (ExpOfDifference): a multiply per query and vector of keys fewer.
struct QuantQueryQ8 {
  float qscale;
  HWY_ALIGN int16_t q16[kMaxHeadDim];  // the integers in element order
  // The same as bytes, and -128 * their sum: VNNI scores sealed keys as unsigned bytes k + 128
  // (ScoreSealedPassQ8), whose products exceed the q8 products by that.
  HWY_ALIGN int8_t q8[kMaxHeadDim];
  int32_t bias;
};
struct QuantQueryQ4 {
  float qscale;
  HWY_ALIGN int8_t lo[kMaxHeadDim / 2];  // byte j of group g: element 32g + j ...
  HWY_ALIGN int8_t hi[kMaxHeadDim / 2];  // ... and element 32g + 16 + j, matching the nibbles
  int32_t group_init[kMaxHeadDim / 32];  // -8 * (sum of group g), for the nibbles' offset
#if FD_Q4_INT16_SUMS
  // q4 without VNNI: the words of lo and hi that scoring step s reads (4 bytes each from 4s),
  // [s][0] and [s][1], each repeated over a vector, so that pmaddubsw takes them from memory.
  // Broadcast per product, they were 8 of the 27 vector operations of a 4-query step (llvm-mca,
  // Zen 3: 7.0 -> 5.7 cycles a step). AMD EPYC (Zen 3, AVX2), ctx 4096, one core, KV in cache, 30
  // adjacent pairs: GQA 4 1.06x (hd64) and 1.08x (hd128) as fast, GQA 8 1.09x and 1.03x, GQA 1
  // 1.00x and 0.99x.
  static constexpr size_t kWordRow = HWY_MAX_BYTES;  // a vector
  HWY_ALIGN int8_t words[kMaxHeadDim / 8][2][kWordRow];
#endif
};
template <bool kQ4>
using QuantQuery = std::conditional_t<kQ4, QuantQueryQ4, QuantQueryQ8>;

// QuantizeQueryInts in vectors when Lanes(df) divides hd (the same integers and scale: the
// products and maxima are exact alike, and NearestInt rounds to nearest even as nearbyint does).
template <class DF>
HWY_INLINE float QuantizeQueryIntsVec(DF df, const float* q, size_t hd, float levels, int32_t* qi) {
  const size_t L = hn::Lanes(df);
  if (hd % L != 0) return QuantizeQueryInts(q, hd, levels, qi);
  const hn::RebindToSigned<DF> di;
  const auto scale = hn::Set(df, 1.0f / std::sqrt(static_cast<float>(hd)));
  auto vmax = hn::Zero(df);
  auto finite = hn::FirstN(df, L);
  for (size_t c = 0; c < hd; c += L) {
    const auto x = hn::Mul(hn::LoadU(df, q + c), scale);
    vmax = hn::Max(vmax, hn::Abs(x));
    finite = hn::And(finite, hn::IsFinite(x));
  }
  if (!hn::AllTrue(df, finite)) return NonFiniteQuery(hd, qi);
  const float qscale = hn::GetLane(hn::MaxOfLanes(df, vmax)) / levels;
  const auto inv = hn::Set(df, qscale > 0.0f ? 1.0f / qscale : 0.0f);
  const auto hi = hn::Set(di, static_cast<int32_t>(levels)), lo = hn::Neg(hi);
  for (size_t c = 0; c < hd; c += L) {
    const auto r = hn::NearestInt(hn::Mul(hn::Mul(hn::LoadU(df, q + c), scale), inv));
    hn::StoreU(hn::Min(hn::Max(r, lo), hi), di, qi + c);
  }
  return qscale;
}

template <bool kQ4>
void QuantizeQuery(const float* q, size_t hd, QuantQuery<kQ4>& qq) {
  int32_t qi[kMaxHeadDim];
  qq.qscale = QuantizeQueryIntsVec(hn::CappedTag<float, 16>(), q, hd, kQ4 ? kQ4Levels : kQ8Levels, qi);
  // The integers are within int8 (levels 127), so DemoteTo keeps them.
  const hn::CappedTag<int32_t, 16> d32;
  const hn::Rebind<int8_t, decltype(d32)> d8;
  const size_t L = hn::Lanes(d32);
  if constexpr (kQ4) {
    for (size_t g = 0; g < hd / 32; ++g) {
      auto sum = hn::Zero(d32);
      for (size_t j = 0; j < 16; j += L) {
        const auto lo = hn::LoadU(d32, qi + g * 32 + j), hi = hn::LoadU(d32, qi + g * 32 + 16 + j);
        hn::StoreU(hn::DemoteTo(d8, lo), d8, qq.lo + g * 16 + j);
        hn::StoreU(hn::DemoteTo(d8, hi), d8, qq.hi + g * 16 + j);
        sum = hn::Add(sum, hn::Add(lo, hi));
      }
      qq.group_init[g] = -8 * hn::GetLane(hn::SumOfLanes(d32, sum));
    }
#if FD_Q4_INT16_SUMS
    for (size_t step = 0; step < hd / 8; ++step)
      for (size_t b = 0; b < QuantQueryQ4::kWordRow; b += 4) {
        std::memcpy(qq.words[step][0] + b, qq.lo + 4 * step, 4);
        std::memcpy(qq.words[step][1] + b, qq.hi + 4 * step, 4);
      }
#endif
  } else {
    const hn::Rebind<int16_t, decltype(d32)> d16;
    auto sum = hn::Zero(d32);
    size_t c = 0;
    for (; c + L <= hd; c += L) {
      const auto v = hn::LoadU(d32, qi + c);
      hn::StoreU(hn::DemoteTo(d16, v), d16, qq.q16 + c);
      hn::StoreU(hn::DemoteTo(d8, v), d8, qq.q8 + c);
      sum = hn::Add(sum, v);
    }
    int32_t total = hn::GetLane(hn::SumOfLanes(d32, sum));
    for (; c < hd; ++c) {
      qq.q16[c] = static_cast<int16_t>(qi[c]);
      qq.q8[c] = static_cast<int8_t>(qi[c]);
      total += qi[c];
    }
    qq.bias = -128 * total;
  }
}

// Tenths of a tile's share of the next visit's K and V fetched while its keys are scored and while
// its weights are rounded; the rest is fetched while its values are summed (see AttendBlockQuant).
struct FetchTenths {
  size_t key[2], value[2];
};
// Of the bytes, 4 tenths while scoring and 3 in each other phase. Every format fetches while it
// sums the values: with no fetch there, memory idled through the sums.
// - Without VNNI, whose value sums (pmaddubsw) are several times longer, one core's time from
//   memory was its time with KV in cache plus the read's, as if nothing overlapped. AMD EPYC (Zen
//   3, AVX2), ctx 4096, batch 16, two copies at once, one core each, cores swapped, geometric
//   means of 8 pairs (q8: 6): q4 hd128 GQA 1 1.46x as fast, GQA 4 1.23x, hd64 1.19x and 1.04x; q8
//   hd64 GQA 1 1.35x, GQA 4 0.96x. 2 threads, medians of 3 alternating runs, GB/s (batch 16, 64):
//   q4 hd128 GQA 1 11.1 -> 15.0, 11.4 -> 15.9; q8 hd64 GQA 1 13.6 -> 17.3, 12.5 -> 15.6, GQA 4
//   10.7 -> 12.9, 12.0 -> 12.1.
// - Intel Xeon (AVX-512 VNNI, 2 of its cores), ctx 4096, one build switching between the two, 5
//   alternating runs, medians of the fraction of the stream read: q4 batch 16 hd64 GQA 1 0.76 ->
//   0.90 and 0.93, GQA 4 0.58 -> 0.65 and 0.66, hd128 GQA 1 0.79 -> 0.89 and 0.93, GQA 4 0.69 ->
//   0.79 and 0.79 (two sets); q8 hd64 GQA 1 0.93-0.96 -> 1.05-1.08, GQA 4 0.85-0.86 -> 0.92-0.95
//   (batch 16 and 64).
// - AMD EPYC (Zen 5, AVX-512 VNNI), 2 threads, from memory (4 layers), one build switching
//   between the two, 30 alternating pairs of passes, median ratios: q4 hd128 GQA 1 1.19-1.21x as
//   fast (ctx 512 and 4096), GQA 4 1.16x, hd64 GQA 1 1.05x, GQA 4 1.03-1.07x; q8 hd64 GQA 4
//   1.11-1.15x, GQA 1 1.01-1.02x. Before, with VNNI on AMD only q8 hd128 fetched there (ctx 4096,
//   batch 16, GQA 4, two copies at once, one core each, cores swapped: 1.13-1.23x as fast in 4
//   pairs; 2 threads, medians of 3 alternating runs: 29.1 -> 36.4 GB/s, batch 64 30.5 -> 37.4),
//   since those measurements on Zen 5 had read q8 hd64 and q4 0.88-1.00x as fast with it. With the
//   KV in cache (one core, ctx 512) the fetch's instructions cost q8 hd64 GQA 4 0.93x and q4 0.98x.
constexpr FetchTenths kFetchInAllPhases = {{5, 3}, {3, 3}};

// The split for NQ queries per kv head of head_dim hd. One query's softmax and rounding
// (FoldTileToWeights) are a few instructions per key, too short a phase to issue a share of the
// fetch in: its share goes to the scoring instead. AMD EPYC (Zen 5), --threads 2 --ctx 4096
// --batch 16, 2 alternating runs, GB/s with the fold's share -> with it moved: q8 hd128 41.0 ->
// 48.1, q4 hd64 36.2 -> 43.9 (the runs' ranges overlap), q8 hd64 and q4 hd128 +6 and +3 %.
// At head_dim 64 one query fetches 4 tenths of each while scoring and the rest while summing, where
// the split above leaves it 8 tenths of K and 6 of V while scoring. AMD EPYC (Zen 5), from memory,
// one build switching between passes (8-12 pairs), median ratio of adjacent passes against it,
// with q4 hd64 fetched two visits ahead (kPrefetchBytes): one thread (ctx 4096, batch 16) q8 hd64
// 1.066x as fast, q4 hd64 1.038x ({3, 0, 3, 0} 1.035x and 1.046-1.051x, {5, 0, 5, 0} 0.944x and
// 1.027x, {3, 3, 3, 3} 0.989x and 1.056-1.068x); 2 threads (slow stream) q8 1.091x (batch 64
// 1.098x, ctx 512 batch 64 1.065x), q4 1.034x (batch 64 1.040x); q4 with the KV in cache 1.039x.
// At hd128 it read 0.894x (q4) and 0.947x (q8), so larger heads keep the split above.
constexpr FetchTenths kFetchOneSmallHead = {{4, 0}, {4, 0}};
// Over KvLayout::kSideBySide, the tile's own values while it scores (see Q8LayoutImpl), and the
// next visit's keys, 2 tenths while it rounds and the rest while it sums: its reads and its fetches
// walk one run of memory, as fp16's do (kFetchOwnValues, kernels/attention.cc).
constexpr FetchTenths kFetchOwnValues = {{0, 2}, {10, 0}};
template <int NQ>
HWY_INLINE FetchTenths SplitOfFetch(size_t hd, KvLayout layout) {
  if (layout == KvLayout::kSideBySide) return kFetchOwnValues;
  if (NQ == 1 && hd <= 64) return kFetchOneSmallHead;
  FetchTenths t = kFetchInAllPhases;
  if (NQ == 1) {
    t.key[0] += t.key[1];
    t.value[0] += t.value[1];
    t.key[1] = t.value[1] = 0;
  }
  return t;
}

// A tile's share of the rows fetched (K bytes [begin, end) after kn, V the same after vn: the next
// visit's, or with kFetchOwnValues this visit's V), cut between the tile's phases: phase p (0
// scoring, 1 rounding, 2 value sums) fetches K [k[p], k[p + 1]) and V [v[p], v[p + 1]).
struct NextShare {
  NextShare(const uint8_t* k_next, const uint8_t* v_next, size_t begin, size_t end, const FetchTenths& tenths,
            FetchTo fetch_to)
      : kn(k_next), vn(v_next), to(fetch_to) {
    const auto cut = [&](size_t t) { return CutTenths(begin, end, t); };
    k[0] = v[0] = begin;
    k[1] = cut(tenths.key[0]);
    k[2] = cut(tenths.key[0] + tenths.key[1]);
    v[1] = cut(tenths.value[0]);
    v[2] = cut(tenths.value[0] + tenths.value[1]);
    k[3] = v[3] = end;
  }
  FetchBoth Phase(int p, size_t slices) const {
    return {PacedPrefetch(kn, k[p], k[p + 1], slices, to), PacedPrefetch(vn, v[p], v[p + 1], slices, to)};
  }
  const uint8_t* kn;
  const uint8_t* vn;
  FetchTo to;
  size_t k[4], v[4];
};

// Queries per q4 scoring pass, and key vectors per pass of NP queries: each keeps NP * W integer
// and as many fp32 sums, within the register file (16 vectors; 32 on AVX-512) and a tile.
constexpr int kQ4PassQ = 4;
template <int NP, class D32>
constexpr int Q4KeyVectors() {
  return VectorsPerPass(HWY_TARGET <= HWY_AVX3 ? 8 : 4, NP, static_cast<int>(kTileT / hn::MaxLanes(D32())));
}

// s[j][col + w * K + i] = raw score of query j against key `key` + w * K + i of a q4 head block
// (keys at `data`, scales at `scales`, kv_format.h) for W vectors of K = Lanes(d32) keys, which
// lie in one key group each. A vector holds four bytes of K keys, so every int32 lane of the dot
// products sums into one key: no horizontal sums. fetch.Next() before every step of 8 elements,
// so that the fetch leaves a line or two at a time (see ScoreKeyVectors, kernels/attention.cc).
// kGfni: the high nibbles by vgf2p8affineqb (KeyNibblesByGfni).
template <int NP, int W, bool kGfni, class D8, class Fetch>
HWY_INLINE void ScoreKeyVectorsQ4(D8 d8, const uint8_t* data, const uint16_t* scales, size_t key, size_t hd,
                                  const QuantQueryQ4* qq, float (*s)[kTileT], size_t col, Fetch& fetch) {
  const hn::RebindToSigned<D8> di8;
  const hn::Repartition<int32_t, D8> d32;
  const hn::Repartition<float, D8> df;
  using VF = hn::Vec<decltype(df)>;
  const size_t K = hn::Lanes(d32), groups = hd / 32;
  const uint8_t* k0[W];    // step 0 of each vector's keys; a step (8 elements) is 64 bytes
  const uint16_t* sc0[W];  // group 0 of each vector's scales; a group is kQ4ScaleRows scales
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w) {
    const size_t t = key + static_cast<size_t>(w) * K;
    k0[w] = data + detail::q4_key_index(t, 0, hd);
    sc0[w] = scales + detail::q4_scale_index(t, 0, groups);
  }
  VF f[W][NP];
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w)
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) f[w][j] = hn::Zero(df);
#if !FD_Q4_INT16_SUMS
  // A query word broadcast into a register, shared by the W key vectors. Against it, AMD EPYC
  // (Zen 5), 4-query int4 hd64, ctx 4096, batch 2, KV in cache, two copies at once, one core
  // each, cores swapped, 5 pairs: read by VNNI's embedded broadcast ({1to16}, no register)
  // 0.93-0.98x as fast; the low and high nibbles summed into accumulators of their own
  // (dependency chains half as long, scores summed in memory per group) 0.98-0.99x.
  const auto word = [&](const int8_t* bytes) HWY_ATTR {
    int32_t x;
    std::memcpy(&x, bytes, sizeof x);
    return hn::BitCast(di8, hn::Set(d32, x));
  };
#endif
  for (size_t g = 0; g < groups; ++g) {
#if FD_X86_VNNI
    hn::Vec<decltype(d32)> a[W][NP];  // the group's sums, from its nibble offset
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
      const auto init = hn::Set(d32, qq[j].group_init[g]);
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) a[w][j] = init;
    }
#else
    // int16 lanes of at most 2 * 15 * 127 per product pair, 8 pairs per group: exact.
    static_assert(8 * 2 * 15 * kQ4Levels <= 32767.0f, "a group's pair sums must fit int16");
    hn::Vec<hn::Repartition<int16_t, D8>> a[W][NP];
#pragma GCC unroll 8
    for (int w = 0; w < W; ++w)
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) a[w][j] = hn::Zero(hn::Repartition<int16_t, D8>());
#endif
    // Unrolled, the steps' products are all computed first: AVX-512 holds them, AVX2 spilled them
    // (77 stack accesses in the 4-query function).
#if HWY_TARGET <= HWY_AVX3
#pragma GCC unroll 4
#else
#pragma GCC unroll 1
#endif
    for (size_t i = 0; i < 4; ++i) {
      const size_t step = 4 * g + i;
      fetch.Next();
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) {
        const auto b = hn::LoadU(d8, k0[w] + step * 4 * kQ4KeyGroup);
        const auto lo = hn::And(b, hn::Set(d8, 15)), hi = KeyHighNibbles<kGfni>(b);
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) {
#if FD_Q4_INT16_SUMS
          static_assert(hn::MaxLanes(D8()) <= sizeof qq[j].words[0][0], "a row of words must fill a vector");
          const auto ql = hn::Load(di8, qq[j].words[step][0]), qh = hn::Load(di8, qq[j].words[step][1]);
#else
          const auto ql = word(qq[j].lo + 4 * step), qh = word(qq[j].hi + 4 * step);
#endif
#if FD_X86_VNNI
          a[w][j] = hn::Vec<decltype(d32)>{DotBytes(DotBytes(a[w][j].raw, lo.raw, ql.raw), hi.raw, qh.raw)};
#else
          a[w][j] = hn::Add(a[w][j], hn::Add(MulPairs(d8, lo, ql), MulPairs(d8, hi, qh)));
#endif
        }
      }
    }
#pragma GCC unroll 8
    for (int w = 0; w < W; ++w) {
      const VF sc = LoadF16(df, sc0[w] + g * kQ4ScaleRows);
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) {
#if FD_X86_VNNI
        const auto sums = a[w][j];
#else
        const auto sums = hn::Add(SumPairs(d32, a[w][j]), hn::Set(d32, qq[j].group_init[g]));
#endif
        f[w][j] = hn::MulAdd(hn::ConvertTo(df, sums), sc, f[w][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w)
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j)
      hn::StoreU(f[w][j], df, s[j] + col + static_cast<size_t>(w) * K);
}

// s[j][0, n) (and up to the next whole vector of keys) = raw scores of query j against the keys
// [tb, tb + n) of a q4 head block (tb a multiple of kQ4KeyGroup), kQ4PassQ queries at a time. The
// scoring phase of `next` is fetched meanwhile, paced by the first pass. Not inlined: in a
// function of its own the loop keeps its pointers in registers (inlined into AttendBlockQuant,
// the old row-major q4 loop spilled them).
template <int NQ, bool kGfni, class D8>
HWY_NOINLINE void ScoreTileQ4(D8 d8, const uint8_t* data, const uint16_t* scales, size_t tb, size_t n, size_t hd,
                              const QuantQueryQ4* qq, float (*s)[kTileT], const NextShare& next) {
  const hn::Repartition<int32_t, D8> d32;
  // Passes over the tile's key vectors for NP queries; every q4 key lies in a whole key group (a
  // block is padded to them).
  const auto walk = [&](auto np, const auto& pass) HWY_ATTR {
    ForEachKeyPass<Q4KeyVectors<decltype(np)::value, decltype(d32)>()>(
        0, tb, n, std::numeric_limits<size_t>::max(), hn::Lanes(d32), pass, [](size_t) {});
  };
  const auto score = [&](auto np, size_t j0, auto& fetch) HWY_ATTR {
    walk(np, [&](size_t t, auto width) HWY_ATTR {
      ScoreKeyVectorsQ4<decltype(np)::value, decltype(width)::value, kGfni>(d8, data, scales, tb + t, hd, qq + j0,
                                                                             s + j0, t, fetch);
    });
  };
  const std::integral_constant<int, (NQ < kQ4PassQ ? NQ : kQ4PassQ)> first;
  size_t passes = 0;
  walk(first, [&](size_t, auto) { ++passes; });
  FetchBoth fetch = next.Phase(0, passes * (hd / 8));  // Next() once per step
  score(first, 0, fetch);
  if constexpr (NQ > kQ4PassQ) {
    NoFetch none;
    score(std::integral_constant<int, NQ - kQ4PassQ>(), kQ4PassQ, none);
  }
}

// The same for a q8 head block whose keys are rows of int8 (one not yet full; see ScoreSealedQ8),
// with fp16 scales `scales` (indexed by row).
// DK: int16 lanes per chunk. Each key chunk is widened once for up to four queries on AVX-512 and
// two before it (more would not fit the accumulators in registers: four on AVX2 spilled, and two
// passes of two read hd64 and hd128 GQA 4 11 % faster, KV in L2 on AMD EPYC Zen 3).
template <int NQ, class DK>
HWY_INLINE void ScoreQuadQ8(DK dk, const int8_t* data, size_t hd, const size_t* rows,
                            const uint16_t* scales, const QuantQueryQ8* qq, float (*s)[kTileT], size_t col) {
  constexpr int kPassQ = HWY_TARGET <= HWY_AVX3 ? 4 : 2;
  if constexpr (NQ > kPassQ) {
    ScoreQuadQ8<kPassQ>(dk, data, hd, rows, scales, qq, s, col);
    ScoreQuadQ8<NQ - kPassQ>(dk, data, hd, rows, scales, qq + kPassQ, s + kPassQ, col);
  } else {
    const hn::Rebind<int8_t, DK> d8;
    const hn::Repartition<int32_t, DK> d32;
    const hn::Full128<float> d4;
    const hn::Full128<int32_t> d4i;
    const size_t L = hn::Lanes(dk);
    uint16_t row_scale[4];
    for (int i = 0; i < 4; ++i) row_scale[i] = scales[rows[i]];
    const auto rs = LoadF16(d4, row_scale);
    hn::Vec<decltype(d32)> a[NQ][4], a1[NQ][4];
#pragma GCC unroll 4
    for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) a[j][i] = a1[j][i] = hn::Zero(d32);
    for (size_t c = 0; c < hd; c += L) {
      hn::Vec<DK> k[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) k[i] = hn::PromoteTo(dk, hn::LoadU(d8, data + rows[i] * hd + c));
#pragma GCC unroll 4
      for (int j = 0; j < NQ; ++j) {
        const auto qv = hn::Load(dk, qq[j].q16 + c);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
#if FD_X86_VNNI
          a[j][i] = hn::Vec<decltype(d32)>{DotWords(a[j][i].raw, k[i].raw, qv.raw)};
#else
          a[j][i] = hn::ReorderWidenMulAccumulate(d32, k[i], qv, a[j][i], a1[j][i]);
#endif
        }
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) a[j][i] = hn::Add(a[j][i], a1[j][i]);
      const auto r = hn::BitCast(d4i, FoldBlocks(d32, Combine4InBlocks(d32, a[j][0], a[j][1], a[j][2], a[j][3])));
      hn::StoreU(hn::Mul(hn::ConvertTo(d4, r), rs), d4, s[j] + col);
    }
  }
}

#if FD_X86_VNNI
// Bytes 4i .. 4i + 3 of the result = bytes 2i, 2i + 1 of a and then of b: the pair rows of two
// consecutive pairs of dimensions (Lanes(du8) / 4 keys each) as each key's four bytes.
template <class DU8, class V8>
HWY_INLINE hn::Vec<DU8> QuadsOfPairRows(DU8, V8 a, V8 b) {
  if constexpr (hn::MaxLanes(DU8()) == 64) {
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    return hn::Vec<DU8>{_mm512_permutex2var_epi16(_mm512_castsi256_si512(a.raw), idx, _mm512_castsi256_si512(b.raw))};
  } else if constexpr (hn::MaxLanes(DU8()) == 32) {
    const __m256i idx = _mm256_set_epi16(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return hn::Vec<DU8>{_mm256_permutex2var_epi16(_mm256_castsi128_si256(a.raw), idx, _mm256_castsi128_si256(b.raw))};
  } else {
    static_assert(hn::MaxLanes(DU8()) == 16, "q8 keys are scored in vectors of 16 to 64 bytes");
    return hn::Vec<DU8>{_mm_unpacklo_epi16(a.raw, b.raw)};
  }
}
#endif

// int32 lane i of acc += a[2i] * b[2i] + a[2i+1] * b[2i+1], int16 a and b.
template <class D32, class V16>
HWY_INLINE hn::Vec<D32> AddPairProducts(D32 d32, hn::Vec<D32> acc, V16 a, V16 b) {
#if FD_X86_VNNI
  (void)d32;
  return hn::Vec<D32>{DotWords(acc.raw, a.raw, b.raw)};
#elif FD_X86_MADD
  (void)d32;
  return hn::Add(acc, hn::Vec<D32>{Madd16(a.raw, b.raw)});
#else
  const auto a32 = hn::BitCast(d32, a), b32 = hn::BitCast(d32, b);
  const auto even = hn::Mul(hn::ShiftRight<16>(hn::ShiftLeft<16>(a32)), hn::ShiftRight<16>(hn::ShiftLeft<16>(b32)));
  return hn::Add(acc, hn::Add(even, hn::Mul(hn::ShiftRight<16>(a32), hn::ShiftRight<16>(b32))));
#endif
}

// s[j][col + w * TV + i] = raw score of query j against key i of key vector w, for NP queries and W
// vectors of TV = Lanes(dk) / 2 consecutive keys of sealed q8 keys: kt [hd/2][stride][2] int8 at
// the first key, sc its fp16 scales. Each int16 vector holds two elements of TV keys, so every
// int32 lane of the pair products sums into one key: no horizontal sums. fetch.Next() every
// `cadence` pairs of dimensions.
template <int NP, int W, class DK, class Fetch>
HWY_INLINE void ScoreSealedPassQ8(DK dk, const int8_t* kt, size_t stride, const uint16_t* sc, size_t hd,
                                  const QuantQueryQ8* qq, float (*s)[kTileT], size_t col, size_t cadence,
                                  Fetch& fetch) {
  const hn::Rebind<int8_t, DK> d8;
  const hn::Repartition<int32_t, DK> d32;
  const hn::Repartition<float, DK> df;
  const size_t TV = hn::Lanes(df);
  hn::Vec<decltype(d32)> a[NP][W];
  const size_t pairs = hd / 2;
#if FD_X86_VNNI
  // Two pairs of dimensions at a time: the pair rows e and e + 1 of TV keys interleaved into each
  // key's four bytes, made unsigned (+128, qq.bias undoes it), then one vpdpbusd per query sums
  // four products per key where vpdpwssd summed two of widened keys (hd is a multiple of 8 on the
  // vector path, so the pairs come in twos). AMD EPYC (Zen 5), against vpdpwssd, 3 alternating
  // runs: KV in cache (--ctx 512 --batch 4 --cold-size 0) 2 threads hd64 GQA 1 1.02x as fast, GQA 4
  // 1.08x, hd128 1.09x and 1.16x; prefill (--decode 0) hd128 1.10-1.19x, hd64 0.95-1.05x; from
  // memory (ctx 512/4096, batch 16/64) 0.92-1.07x, as fp16's unchanged kernel.
  (void)dk;
  const hn::Repartition<uint8_t, DK> du8;
  const auto unsign = hn::Set(du8, uint8_t{0x80});
#pragma GCC unroll 4
  for (int j = 0; j < NP; ++j)
#pragma GCC unroll 8
    for (int w = 0; w < W; ++w) a[j][w] = hn::Set(d32, qq[j].bias);
  for (size_t e0 = 0; e0 < pairs; e0 += cadence) {
    fetch.Next();
    const size_t e1 = std::min(pairs, e0 + cadence);
    for (size_t e = e0; e < e1; e += 2) {
      hn::Vec<decltype(du8)> k[W];
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) {
        const int8_t* row = kt + (e * stride + static_cast<size_t>(w) * TV) * 2;
        const auto pairs_e = hn::LoadU(d8, row), pairs_next = hn::LoadU(d8, row + stride * 2);
        k[w] = hn::Xor(QuadsOfPairRows(du8, pairs_e, pairs_next), unsign);
      }
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) {
        int32_t quad;  // the query's elements 2e .. 2e + 3
        std::memcpy(&quad, qq[j].q8 + 2 * e, sizeof quad);
        const auto qb = hn::Set(d32, quad);
#pragma GCC unroll 8
        for (int w = 0; w < W; ++w) a[j][w] = hn::Vec<decltype(d32)>{DotBytes(a[j][w].raw, k[w].raw, qb.raw)};
      }
    }
  }
#else
#pragma GCC unroll 4
  for (int j = 0; j < NP; ++j)
#pragma GCC unroll 8
    for (int w = 0; w < W; ++w) a[j][w] = hn::Zero(d32);
  for (size_t e0 = 0; e0 < pairs; e0 += cadence) {
    fetch.Next();
    const size_t e1 = std::min(pairs, e0 + cadence);
    for (size_t e = e0; e < e1; ++e) {
      hn::Vec<DK> k[W];
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) k[w] = hn::PromoteTo(dk, hn::LoadU(d8, kt + (e * stride + static_cast<size_t>(w) * TV) * 2));
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) {
        int32_t word;  // the query's elements 2e and 2e + 1
        std::memcpy(&word, qq[j].q16 + 2 * e, sizeof word);
        const auto qb = hn::BitCast(dk, hn::Set(d32, word));
#pragma GCC unroll 8
        for (int w = 0; w < W; ++w) a[j][w] = AddPairProducts(d32, a[j][w], k[w], qb);
      }
    }
  }
#endif
#pragma GCC unroll 4
  for (int j = 0; j < NP; ++j) {
#pragma GCC unroll 8
    for (int w = 0; w < W; ++w) {
      const auto scale = LoadF16(df, sc + static_cast<size_t>(w) * TV);
      hn::StoreU(hn::Mul(hn::ConvertTo(df, a[j][w]), scale), df, s[j] + col + static_cast<size_t>(w) * TV);
    }
  }
}

// Queries per sealed q8 pass: AVX2 keeps 2 x 4 sums, 4 keys and a query pair in 13 of its 16
// registers.
constexpr int kSealedPassQ = HWY_TARGET <= HWY_AVX3 ? 4 : 2;

// Key vectors per sealed q8 pass of NP queries: at most a key group (kQ8KeyGroup keys), so that a
// pass reads one run of memory. Over keys transposed as a whole block ([hd/2][bt][2]), the passes
// of 32 keys read 64 bytes of every 128, and GQA 4 read 6-37 % slower from memory (AMD EPYC
// Zen 3, 2 threads, ctx 512/4096, batch 16/64, medians of 5 alternating runs).
template <int NP, class DK>
constexpr int SealedVectors() {
  constexpr int group = static_cast<int>(kQ8KeyGroup) / static_cast<int>(hn::MaxLanes(DK()) / 2);
  static_assert(group >= 1, "a vector of keys must fit a key group");
  return std::min(NP == 1 ? 8 : 4, group);
}

// ScoreSealedQ8 for the queries qq [NQ], in passes of kSealedPassQ.
template <int NQ, class DK, class Fetch>
HWY_INLINE void ScoreSealedQueriesQ8(DK dk, const int8_t* kd, const uint16_t* scales, size_t tb, size_t n, size_t bt,
                                     size_t hd, const QuantQueryQ8* qq, float (*s)[kTileT], size_t cadence,
                                     Fetch& fetch) {
  if constexpr (NQ > kSealedPassQ) {
    ScoreSealedQueriesQ8<kSealedPassQ>(dk, kd, scales, tb, n, bt, hd, qq, s, cadence, fetch);
    ScoreSealedQueriesQ8<NQ - kSealedPassQ>(dk, kd, scales, tb, n, bt, hd, qq + kSealedPassQ, s + kSealedPassQ,
                                            cadence, fetch);
  } else {
    constexpr int W = SealedVectors<NQ, DK>();
    const size_t TV = hn::Lanes(dk) / 2;
    // Key t's first pair, and the keys of its group (the stride between its pairs).
    const auto at = [&](size_t t) { return kd + detail::q8_key_index(true, t, 0, hd, bt); };
    const auto width = [&](size_t t) { return detail::run_of(t, kQ8KeyGroup, bt).width; };
    size_t v = 0;  // keys done; passes start at multiples of their keys, so each lies in one group
    for (; v + W * TV <= n && tb + v + W * TV <= bt; v += W * TV)
      ScoreSealedPassQ8<NQ, W>(dk, at(tb + v), width(tb + v), scales + tb + v, hd, qq, s, v, cadence, fetch);
    for (; v < n && tb + v + TV <= bt; v += TV)
      ScoreSealedPassQ8<NQ, 1>(dk, at(tb + v), width(tb + v), scales + tb + v, hd, qq, s, v, cadence, fetch);
    if (v < n) {  // the block's last keys, fewer than TV: copied into a block of TV keys
      HWY_ALIGN int8_t keys[kMaxHeadDim / 2 * 32];
      HWY_ALIGN uint16_t sc[16] = {};
      const size_t m = bt - (tb + v);
      const detail::Run g = detail::run_of(tb + v, kQ8KeyGroup, bt);
      // Bytes from key tb + v's first pair to the end of its group's last pair row.
      const size_t readable = (hd / 2 * g.width - (tb + v - g.start)) * 2;
      CopyRowsZeroPadded(hn::Half<hn::Repartition<uint8_t, DK>>(), Bytes(at(tb + v)), g.width * 2, m * 2, hd / 2, readable,
                         TV * 2, reinterpret_cast<uint8_t*>(keys));
      std::memcpy(sc, scales + tb + v, m * sizeof(uint16_t));
      ScoreSealedPassQ8<NQ, 1>(dk, keys, TV, sc, hd, qq, s, v, cadence, fetch);
    }
  }
}

// s[j][0, n) (and up to the next whole vector of keys) = raw scores of query j against the keys
// [tb, tb + n) of a sealed q8 head block (key groups at kd, fp16 scales [bt]). The scoring phase
// of `next` is fetched meanwhile, in about 16 steps, as the row-major keys are (in bursts of a
// quarter tile, GQA 1 read slower from memory).
template <int NQ, class DK>
HWY_INLINE void ScoreSealedQ8(DK dk, const int8_t* kd, const uint16_t* scales, size_t tb, size_t n, size_t bt,
                              size_t hd, const QuantQueryQ8* qq, float (*s)[kTileT], const NextShare& next) {
  constexpr size_t kSteps = 16;
  constexpr int NP = NQ < kSealedPassQ ? NQ : kSealedPassQ;
  const size_t TV = hn::Lanes(dk) / 2;
  const size_t passes = static_cast<size_t>((NQ + kSealedPassQ - 1) / kSealedPassQ) *
                        std::max<size_t>(1, n / (TV * SealedVectors<NP, DK>()));
  const size_t pairs = hd / 2;
  size_t cadence = std::max<size_t>(1, (pairs * passes + kSteps - 1) / kSteps);
  if (FD_X86_VNNI) cadence += cadence % 2;  // its steps take two pairs
  FetchBoth fetch = next.Phase(0, passes * ((pairs + cadence - 1) / cadence));
  ScoreSealedQueriesQ8<NQ>(dk, kd, scales, tb, n, bt, hd, qq, s, cadence, fetch);
}

constexpr int kMaxGroups = kMaxHeadDim / 32;  // q4 scale groups per row

// A tile's value weights for NQ queries and the scale groups (see kernels/kv_format.h): w[t] =
// probability * scale ~ u * factor[j][g] with u in [0, levels], levels kWeightLevels. The words of
// rows 4k..4k+3 (quad k) of queries 4s..4s+3 lie side by side, u[g][s][k][j - 4s], as packing four
// vectors of ints within 128-bit lanes leaves them (StoreQuadWords).
template <bool kQ4>
constexpr float kWeightLevels = kQ4 ? 255.0f : 127.0f;  // q8: DotQuads<true>'s bound
template <int NQ>
struct TileWeights {
  static constexpr int kSets = (NQ + 3) / 4;  // sets of four queries; the last padded with zeros
  HWY_ALIGN uint8_t u[kMaxGroups][kSets][kTileT / 4][4][4];
  float factor[NQ][kMaxGroups];
};

// The weights p * inv (p >= 0 and p * inv <= levels up to rounding), rounded to the nearest
// integer w in [0, levels] by adding 2^23, whose fp32 ulp is 1, as the bits of 2^23 + w:
// kWeightBias + w, whose low byte is w.
constexpr int32_t kWeightBias = 0x4B000000;
template <class DT>
HWY_INLINE hn::Vec<hn::RebindToSigned<DT>> RoundWeights(DT dt, hn::Vec<DT> p, hn::Vec<DT> inv) {
  return hn::BitCast(hn::RebindToSigned<DT>(), hn::MulAdd(p, inv, hn::Set(dt, 8388608.0f)));
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
// Byte 16L + 4j + i of the result is the low byte of int32 lane 4L + i of k[j]: the layout of
// StoreQuadWords, by two byte permutes (AVX-512 VBMI) of two vectors each and a blend.
HWY_INLINE __m512i LowBytesOfQuads(const __m512i* k) {
  struct Index {
    alignas(64) uint8_t b[64];
  };
  static constexpr Index kIndex = [] {
    Index x{};
    // Byte 4i of lane 16L + ... of k[j] (table 0 for k[0] and k[2], 1 for k[1] and k[3]).
    for (int p = 0; p < 64; ++p) x.b[p] = static_cast<uint8_t>(((p & 4) << 4) | (p & 0x30) | ((p & 3) << 2));
    return x;
  }();
  const __m512i index = _mm512_load_si512(kIndex.b);
  const __m512i low = _mm512_permutex2var_epi8(k[0], index, k[1]);   // right where j is 0 or 1
  const __m512i high = _mm512_permutex2var_epi8(k[2], index, k[3]);  // ... 2 or 3
  return _mm512_mask_blend_epi8(0xFF00FF00FF00FF00ull, low, high);
}
#endif

// Stores the rounded weights k[0..3] of four queries (RoundWeights: int32 lanes kWeightBias + w,
// w in [0, 255]) for Lanes(di) rows as Lanes(di) / 4 quads of words [quad][query][4] at `out`.
// With AVX-512 VBMI the weights are the lanes' low bytes, gathered by LowBytesOfQuads in three
// instructions. Elsewhere, less the bias, two packing steps within 128-bit lanes put them so: 3
// instructions and one store for the four queries, where demoting each query's vector alone took
// 4 and a store of its own (GCC 12, AVX2). AMD EPYC (Zen 3, AVX2), ctx 4096, one core, KV in
// cache, 20 adjacent pairs, medians: GQA 4 int4 1.06-1.09x and int8 1.11-1.15x as fast, GQA 1
// 1.02-1.11x.
template <class DI>
HWY_INLINE void StoreQuadWords(DI di, const hn::Vec<DI>* k, uint8_t* out) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
  if constexpr (hn::MaxLanes(DI()) == 16) {
    const __m512i raw[4] = {k[0].raw, k[1].raw, k[2].raw, k[3].raw};
    _mm512_storeu_si512(out, LowBytesOfQuads(raw));
    return;
  }
#endif
  hn::Vec<DI> w[4];
  for (int j = 0; j < 4; ++j) w[j] = hn::Sub(k[j], hn::Set(di, kWeightBias));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
  const hn::Repartition<uint8_t, DI> du8;
  const auto packed = PackBytes(PackWords(w[0].raw, w[1].raw), PackWords(w[2].raw, w[3].raw));
  hn::StoreU(hn::Vec<decltype(du8)>{packed}, du8, out);
#else
  const hn::Rebind<uint8_t, DI> dn;
  constexpr size_t kMax = hn::MaxLanes(DI());
  HWY_ALIGN uint8_t rows[4][kMax];
  for (int j = 0; j < 4; ++j) hn::StoreU(hn::DemoteTo(dn, w[j]), dn, rows[j]);
  for (size_t q = 0; q < hn::Lanes(di) / 4; ++q)
    for (int j = 0; j < 4; ++j) std::memcpy(out + (4 * q + static_cast<size_t>(j)) * 4, rows[j] + 4 * q, 4);
#endif
}

// Query j's four weights of quad `quad` in group g (one int32 word), in every lane.
template <class D32, int NQ>
HWY_INLINE hn::Vec<D32> QuadWeights(D32 d32, const TileWeights<NQ>& tw, int j, size_t g, int quad) {
  int32_t word;
  std::memcpy(&word, tw.u[g][j / 4][quad][j % 4], sizeof word);
  return hn::Set(d32, word);
}

// acc[j][c0, c0 + CU * L) += factor_j * (sum over the tile's quads of weights . values): the
// quads [kq0, kq0 + n_quads) of q8 value chunks at vd (kv_format.h), weights tw (group 0).
// kWhole: every chunk is kQ8ValueChunk elements wide (then one offset serves all vectors).
// fetch.Next() before every quad.
template <int NQ, int CU, bool kWhole, class DF, class Fetch>
HWY_INLINE void AccumulateQuadsQ8(DF df, const int8_t* vd, size_t hd, size_t bt, size_t kq0, int n_quads,
                                  const TileWeights<NQ>& tw, size_t c0, float (*acc)[kMaxHeadDim],
                                  Fetch& fetch) {
  const hn::RebindToSigned<DF> d32;
  const hn::Repartition<int8_t, decltype(d32)> d8;
  using VI = hn::Vec<decltype(d32)>;
  const size_t L = hn::Lanes(df);
  const int8_t* first[CU];  // vector u's bytes of quad kq0; its chunk's quads are `step` bytes apart
  size_t step[CU];
#pragma GCC unroll 8
  for (int u = 0; u < CU; ++u) {
    const size_t c = c0 + u * L;
    first[u] = vd + detail::q8_value_index(kq0 * 4, c, hd, bt);
    step[u] = (kWhole ? kQ8ValueChunk : detail::run_of(c, kQ8ValueChunk, hd).width) * 4;
  }
  VI a[CU][NQ];
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 8
    for (int u = 0; u < CU; ++u) a[u][j] = hn::Zero(d32);
  for (int k = 0; k < n_quads; ++k) {
    fetch.Next();
    VI v[CU];
#pragma GCC unroll 8
    for (int u = 0; u < CU; ++u) {
      const size_t off = static_cast<size_t>(k) * (kWhole ? kQ8ValueChunk * 4 : step[u]);
      v[u] = hn::BitCast(d32, hn::LoadU(d8, first[u] + off));
    }
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j) {
      const VI w = QuadWeights(d32, tw, j, 0, k);
#pragma GCC unroll 8
      for (int u = 0; u < CU; ++u) a[u][j] = DotQuads<true>(d32, a[u][j], w, v[u]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j) {
    const auto f = hn::Set(df, tw.factor[j][0]);
#pragma GCC unroll 8
    for (int u = 0; u < CU; ++u) {
      float* out = acc[j] + c0 + u * L;
      hn::Store(hn::MulAdd(f, hn::ConvertTo(df, a[u][j]), hn::Load(df, out)), df, out);
    }
  }
}

// The nibbles of q4 value bytes b (four rows' bytes per int32 lane) as signed bytes: lo = low
// nibble - 8, hi = (high nibble - 8) * 2^kQ4HighShift, so that the sums of hi are 2^kQ4HighShift
// times the high nibbles' (with VNNI; see HighNibblesLess8x16).
#if FD_X86_VNNI
constexpr int kQ4HighShift = 4;
#else
constexpr int kQ4HighShift = 0;
#endif
template <class D8, class VI>
HWY_INLINE void SplitNibbles(D8 d8, hn::Vec<D8> b, VI& lo, VI& hi) {
  const hn::DFromV<VI> d32;
#if FD_X86_VNNI
  (void)d8;
  lo = hn::BitCast(d32, hn::Vec<D8>{LowNibblesLess8(b.raw)});
  hi = hn::BitCast(d32, hn::Vec<D8>{HighNibblesLess8x16(b.raw)});
#else
  const hn::RebindToSigned<D8> di8;
  const hn::Repartition<uint16_t, D8> du16;
  const auto low = hn::Set(d8, 15);
  const auto eight = hn::Set(di8, 8);
  const auto nib_hi = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(du16, b))), low);
  lo = hn::BitCast(d32, hn::Sub(hn::BitCast(di8, hn::And(b, low)), eight));
  hi = hn::BitCast(d32, hn::Sub(hn::BitCast(di8, nib_hi), eight));
#endif
}

// Quads of q4 values whose int16 pair sums stay exact without VNNI (see AccumulateQuadsQ4): the
// most quads one call of it may sum.
constexpr int kQ4Int16Quads = 8;

// The same for the quads [k0, k1) of q4 value quads [n_quads][groups][16][4] bytes (nibbles taken
// as nibble - 8), weights tw per query and group. A unit is 4L bytes of one group: its low
// nibbles are elements [32g + j0, + L), its high nibbles [32g + 16 + j0, + L). fetch.Next() before
// every quad.
template <int NQ, int CU, class DF, class Fetch>
HWY_INLINE void AccumulateQuadsQ4(DF df, const uint8_t* quads, size_t groups, int k0, int k1,
                                  const TileWeights<NQ>& tw, size_t u0, float (*acc)[kMaxHeadDim], Fetch& fetch) {
  const hn::RebindToSigned<DF> d32;
  const hn::Repartition<uint8_t, decltype(d32)> d8;
  using VI = hn::Vec<decltype(d32)>;
  const size_t L = hn::Lanes(df);
  const size_t per_group = 16 / L;
  size_t g[CU], at[CU];
#pragma GCC unroll 8
  for (int u = 0; u < CU; ++u) {
    const size_t unit = u0 + static_cast<size_t>(u);
    g[u] = unit / per_group;
    at[u] = unit % per_group * L;  // element offset of the unit's low half within its group
  }
#if FD_Q4_INT16_SUMS
  // Without VNNI, pmaddubsw's int16 pair sums, exact (|pair| <= 2 * 255 * 8 = 4080), are kept in
  // int16 over up to kQ4Int16Quads quads and widened once: two instructions per 32 products
  // (widening the bytes to int16 first took nine).
  static_assert(kQ4Int16Quads * 4080 <= 32767, "the pair sums must fit int16");
  const hn::Repartition<int16_t, decltype(d32)> d16;
  using VA = hn::Vec<decltype(d16)>;
#else
  using VA = VI;
#endif
  VA a[CU][2][NQ];
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 8
    for (int u = 0; u < CU; ++u) a[u][0][j] = a[u][1][j] = hn::Zero(hn::DFromV<VA>());
  for (int k = k0; k < k1; ++k) {
    fetch.Next();
    const uint8_t* quad = quads + static_cast<size_t>(k) * groups * 64;
    VI lo[CU], hi[CU];
#pragma GCC unroll 8
    for (int u = 0; u < CU; ++u) {
      const auto b = hn::LoadU(d8, quad + g[u] * 64 + at[u] * 4);
      SplitNibbles(d8, b, lo[u], hi[u]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 8
      for (int u = 0; u < CU; ++u) {
        const VI w = QuadWeights(d32, tw, j, g[u], k);
#if FD_Q4_INT16_SUMS
        const hn::RebindToSigned<decltype(d8)> di8;
        a[u][0][j] = hn::Add(a[u][0][j], MulPairs(d8, hn::BitCast(d8, w), hn::BitCast(di8, lo[u])));
        a[u][1][j] = hn::Add(a[u][1][j], MulPairs(d8, hn::BitCast(d8, w), hn::BitCast(di8, hi[u])));
#else
        a[u][0][j] = DotQuads(d32, a[u][0][j], w, lo[u]);
        a[u][1][j] = DotQuads(d32, a[u][1][j], w, hi[u]);
#endif
      }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 8
    for (int u = 0; u < CU; ++u) {
      // The high nibbles' sums are multiples of 2^kQ4HighShift below 2^24, converted exactly, and
      // their factor divided by it exactly: the products are those of the shifted sums.
      const float factor = tw.factor[j][g[u]];
      const auto f = hn::Set(df, factor), f_high = hn::Set(df, factor * (1.0f / (1 << kQ4HighShift)));
      for (int h = 0; h < 2; ++h) {
        float* out = acc[j] + g[u] * 32 + at[u] + 16 * h;
#if FD_Q4_INT16_SUMS
        const VI sums = SumPairs(d32, a[u][h][j]);
#else
        const VI sums = a[u][h][j];
#endif
        hn::Store(hn::MulAdd(h == 1 ? f_high : f, hn::ConvertTo(df, sums), hn::Load(df, out)), df, out);
      }
    }
}

// One query tile's running state over its keys (the quantized counterpart of attention.cc's).
template <bool kQ4, int NQ>
struct QuantTileState {
  QuantQuery<kQ4> qq[NQ];
  HWY_ALIGN float acc[NQ][kMaxHeadDim];  // unnormalised outputs
  HWY_ALIGN float s[NQ][kTileT];         // scores, then probabilities, of the current key tile
  float m[NQ], l[NQ];
  int max_limit = 0;    // keys [0, max_limit) are visible to some query of the tile
  int min_limit = 0;    // ... and [0, min_limit) to all of them
  size_t head_off = 0;  // bytes from a block's start to the tile's kv head
};

// exp(s * k - r) (ExpNonPositive<true>) for raw scores s of a query whose scale is k, given
// mul = ExpFactor(dt, k) and ref = ExpFactor(dt, r). On AVX-512, whose exponential works in powers
// of 2, both carry log2(e): s k log2(e) - r log2(e) is one multiply-add, where the scores' scaling,
// a subtraction and a multiply took three.
template <class DT>
HWY_INLINE hn::Vec<DT> ExpFactor(DT dt, float x) {
#if HWY_TARGET <= HWY_AVX3
  return hn::Set(dt, x * kLog2E);
#else
  return hn::Set(dt, x);
#endif
}
template <class DT>
HWY_INLINE hn::Vec<DT> ExpOfDifference(DT dt, hn::Vec<DT> s, hn::Vec<DT> mul, hn::Vec<DT> ref) {
#if HWY_TARGET <= HWY_AVX3
  return Pow2Scalef(dt, hn::MulSub(s, mul, ref));
#else
  return ExpNonPositive<true>(dt, hn::MulSub(s, mul, ref));
#endif
}

// The scale of a query's raw scores (QuantQuery::qscale; the scoring leaves it out): 1 for an
// all-zero query, whose visible raw scores are 0 and whose masked ones -inf must stay -inf.
HWY_INLINE float ScoreScale(float qscale) { return qscale == 0.0f ? 1.0f : qscale; }

// The online-softmax step of SoftmaxFoldTiles (kernels/attention-inl.h) over the tile's scores
// st.s [NQ][kTileT] (the first n real), fused with the rounding of the value weights tw
// (RoundWeights) of `groups` scale groups, whose scales of the tile's keys are scale[g][chunk]
// and their largest smax[g]. A query's largest weight in the tile is known before the
// exponentials, so each weight is rounded as it is computed: rounded in a pass of their own, the
// stored weights took about 16 % of int4 hd64 GQA 4. AMD EPYC (Zen 5), KV in L2
// (ctx 512, batch 2), two copies at once, one core each, cores swapped, 4 pairs: GQA 4 1.02x
// (q4 hd64) to 1.07x (q4 and q8 hd128) as fast, GQA 1 0.99-1.03x. The exponentials are the coarse
// ones (ExpNonPositive<true>, 1.3e-4 relative error), far finer than the 8-bit rounding.
// With ExpOfDifference, the weights' low bytes gathered by LowBytesOfQuads, LargestScales and the
// factors' multiply by 1 / levels (each once a few instructions more), AMD EPYC (Zen 4), one
// core, KV in L2 (--ctx 512 --batch 2 --cold-size 0), medians of 10-20 runs alternating with the
// build before, read in this guest's faster clock: int4 hd64 GQA 4 14.5-14.6 -> 14.9-15.1 GB/s,
// int8 27.6 -> 28.2, int4 GQA 1 unchanged (28.2-28.5).
// fetch.Next() once per chunk.
template <bool kQ4, int NQ, int C, class DT, class DF, class VS>
HWY_INLINE void FoldTileToWeights(DT dt, DF df, int n, size_t groups, const VS (*scale)[C], const float* smax,
                                  size_t hd, QuantTileState<kQ4, NQ>& st, TileWeights<NQ>& tw, FetchBoth& fetch) {
  using VT = hn::Vec<DT>;
  const hn::RebindToSigned<DT> di;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t LT = hn::Lanes(dt);
  float tile_max[NQ], m_new[NQ], k[NQ];
  TileMaxima<NQ>(dt, st.s, n, kTileT, st.m, tile_max, m_new);
  for (int j = 0; j < NQ; ++j) {  // the raw maxima scaled (k > 0 or NaN, which stays NaN)
    k[j] = ScoreScale(st.qq[j].qscale);
    tile_max[j] *= k[j];
    m_new[j] = std::max(st.m[j], tile_max[j]);
  }
  // Each query's m stays the reference of l and acc, as in SoftmaxFoldTiles, unless the tile's
  // max exceeds it by more than kSoftmaxSlack: then m moves to its max and the state is rescaled.
  // The weights are still rounded relative to the tile's own max, so their rounding is unchanged;
  // only their factor, exp(tile max - m), may now exceed 1 (up to e^kSoftmaxSlack). In most tiles
  // no m moves: no exponential of m's change, no pass over acc, no per-query scalar step. AMD EPYC
  // (Zen 5), one build switching between this and moving m in every tile on alternate calls,
  // median ratio of adjacent calls:
  // - KV in L2 (--threads 1 --ctx 512 --batch 2 --cold-size 0): hd64 GQA 4 1.114x as fast (int4)
  //   and 1.115x (int8), hd128 GQA 4 1.062x and 1.066x, GQA 1 1.019-1.022x.
  // - From memory, 2 threads (stream 41-60 GB/s): int4 hd64 GQA 4 1.043x (ctx 4096 batch 16),
  //   1.049x (batch 64), 1.048x (ctx 512 batch 64); int8 hd64 GQA 4 1.008-1.041x; the rest (GQA 1,
  //   hd128) 0.986-1.029x, where the reads set the pace.
  const bool keep = KeepsReferences<NQ>(tile_max, st.m);
  const float* ref = keep ? st.m : m_new;
  // The weights are rounded relative to each query's largest in the tile and each group's
  // largest scale: w = exp(s - tile max) * scale * levels / smax[g], and the factor scales by
  // exp(tile max - ref) * smax[g] / levels afterwards. Rounded relative to exp(tile max - m_new)
  // instead, every weight waited for that exponential and 2 * NQ * groups divisions by it, and
  // paid a multiply per query and group. Intel Xeon (AVX-512 VNNI), one core, KV in L2, medians of
  // 6 alternating runs: q4 hd64 GQA 4 13.5 -> 13.7 GB/s, GQA 1 21.6 -> 22.0, hd128 GQA 4 17.2 ->
  // 17.7, GQA 1 27.2 -> 28.0; q8 unchanged.
  VT vk[NQ], vt[NQ], vsum[NQ];  // ExpOfDifference's multiplier and reference (the tile max)
  for (int j = 0; j < NQ; ++j) {
    vk[j] = ExpFactor(dt, k[j]);
    // A query that sees no key of the tile gets weights of zero.
    vt[j] = ExpFactor(dt, tile_max[j] == neg_inf ? 0.0f : tile_max[j]);
    vsum[j] = hn::Zero(dt);
  }
  float inv[kMaxGroups] = {};  // levels / smax[g], 0 for a NaN scale's group
  for (size_t g = 0; g < groups; ++g) inv[g] = smax[g] > 0.0f ? kWeightLevels<kQ4> / smax[g] : 0.0f;
  for (int c = 0; c < C; ++c) {
    fetch.Next();
    const size_t t = static_cast<size_t>(c) * LT;
    VT p[NQ];
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j) {
      p[j] = ExpOfDifference(dt, hn::Load(dt, st.s[j] + t), vk[j], vt[j]);  // exp(-inf) = 0
      vsum[j] = hn::Add(vsum[j], p[j]);
    }
    for (size_t g = 0; g < groups; ++g) {
      const VT w = hn::Mul(scale[g][c], hn::Set(dt, inv[g]));
#pragma GCC unroll 2
      for (int set = 0; set < TileWeights<NQ>::kSets; ++set) {
        hn::Vec<decltype(di)> k[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const int j = std::min(4 * set + i, NQ - 1);
          k[i] = 4 * set + i < NQ ? RoundWeights(dt, p[j], w) : hn::Set(di, kWeightBias);
        }
        StoreQuadWords(di, k, tw.u[g][set][t / 4][0]);
      }
    }
  }
  float pmaxs[NQ];  // exp(tile max - ref), at most e^kSoftmaxSlack
  ExpOfDifferences<NQ>(tile_max, ref, pmaxs);
  float unit[kMaxGroups];  // the value of a weight's step, before pmax
  for (size_t g = 0; g < groups; ++g) unit[g] = smax[g] * (1.0f / kWeightLevels<kQ4>);
  for (int j = 0; j < NQ; ++j) {
    const float pmax = pmaxs[j];
    vsum[j] = hn::Mul(vsum[j], hn::Set(dt, pmax));
    for (size_t g = 0; g < groups; ++g) tw.factor[j][g] = pmax * unit[g];
  }
  EndSoftmaxStep<NQ>(dt, df, keep, vsum, m_new, st.m, st.l, st.acc, hd);
}

// Scale `t` (within a tile) of group g, where a tile's scales start at sc and its chunks of
// kQ4ScaleRows rows lie `stride` scales apart (q4: a chunk holds every group's; q8: one group).
HWY_INLINE const uint16_t* ScaleAt(const uint16_t* sc, size_t stride, size_t g, size_t t) {
  return sc + g * kQ4ScaleRows + t / kQ4ScaleRows * stride + t % kQ4ScaleRows;
}

// smax[g] = the largest of the fp16 scales (ScaleAt) of rows [0, n), n <= kTileT, of groups
// g < `groups`, as fp32. A row with a NaN or an infinity has a NaN scale (kv_format.cc), and then so
// has the tile: the outputs it reaches (its group's, for q4) are NaN, as they are from the decoded
// row. The scales' bits are compared as unsigned integers: a stored scale is never negative (an
// absolute maximum over 7 or 127, kernels/quantize.cc), and the bits of every NaN and infinity
// lie above those of every finite value. In fp32, with a NaN test since Max may drop a NaN, the
// maxima took three instructions per 16 rows and a reduction of their own per group.
// Each maximum is widened in a register: stored as uint16_t and loaded as a vector of them, the
// load waited for the stores (a store cannot forward to a wider load), where 3.6 % of int4 hd64
// GQA 4's samples in AttendGroupQuant fell.
HWY_INLINE void LargestScales(const uint16_t* sc, size_t stride, size_t groups, int n, float* smax) {
  const hn::CappedTag<uint16_t, kQ4ScaleRows> du;
  const hn::CappedTag<float, 1> d1;
  const size_t rows = static_cast<size_t>(n);
  for (size_t g = 0; g < groups; ++g) {
    auto vmax = hn::Zero(du);
    for (size_t t = 0; t < rows; t += hn::Lanes(du)) {
      const auto bits = hn::LoadU(du, ScaleAt(sc, stride, g, t));
      vmax = hn::Max(vmax, hn::IfThenElseZero(hn::FirstN(du, rows - t), bits));
    }
    const uint16_t top = hn::GetLane(hn::MaxOfLanes(du, vmax));
    smax[g] = hn::GetLane(WidenF16(d1, hn::Set(hn::Rebind<uint16_t, decltype(d1)>(), top)));
  }
}

// What every block of a group's heads shares: worked out once per group, not per block.
struct GroupShape {
  size_t head_bytes;         // one kv head's block of K (or V)
  size_t data_off;           // from a head block's start to its data (kv_format.h)
  size_t pf_pace;            // one row's share of the head's bytes, for the fetch ahead
  bool gfni;                 // KeyNibblesByGfni
  FetchTo fetch_to;          // L2 where FetchesIntoL2, else L1
};
template <bool kQ4>
HWY_INLINE GroupShape GroupShapeOf(size_t head_bytes, size_t bt, size_t hd) {
  return {head_bytes, kQ4 ? detail::q4_data_offset(bt, hd / 32) : detail::q8_data_offset(bt), (head_bytes + bt - 1) / bt,
          KeyNibblesByGfni(), FetchesIntoL2() ? FetchTo::kL2 : FetchTo::kL1};
}

// Streaming softmax over the visible keys of block b in tiles of kTileT keys that start at
// multiples of kTileT within the block: per tile, score every key once for all NQ queries, fold the
// tile into the running max / denominator, then read each value row once. kn, vn: the K and V
// rows read next, fetched meanwhile (the hardware prefetcher stops at pages and head jumps), a
// tile's share of them cut between its phases (NextShare). A prefetch waits for a free L1 miss
// buffer, and memory idles through a phase that fetches nothing (kFetchInAllPhases).
// DK: the key tag (q4: bytes, four per key; q8: int16), DF: the value tag (q4: at most 16 lanes).
template <bool kQ4, int NQ, class DK, class DF>
HWY_INLINE void AttendBlockQuant(DK dk, DF df, const Tile& tile, const KvBlocks& kv, const GroupShape& gs,
                                 size_t b, size_t hd, QuantTileState<kQ4, NQ>& st, const uint8_t* kn,
                                 const uint8_t* vn) {
  const hn::CappedTag<float, kQ4ScaleRows> dt;
  const size_t L = hn::Lanes(df);
  const size_t bt = static_cast<size_t>(kv.block_tokens);
  const size_t groups = hd / 32;
  const size_t head_bytes = gs.head_bytes, data_off = gs.data_off, pf_pace = gs.pf_pace;
  const bool gfni = gs.gfni;

  const uint8_t* kb = Bytes(kv.k[b]) + st.head_off;
  const uint8_t* vb = Bytes(kv.v[b]) + st.head_off;
  const size_t bn = std::min(bt, static_cast<size_t>(st.max_limit) - b * bt);  // rows used
  const uint8_t* kd = kb + data_off;
  const uint8_t* vd = vb + data_off;
  const bool sealed = !kQ4 && (b + 1) * bt <= static_cast<size_t>(kv.len) && detail::q8_seals_keys(hd);
  TileWeights<NQ> tw;  // the current tile's value weights
  for (size_t tb = 0; tb < bn; tb += kTileT) {
    const int n = static_cast<int>(std::min<size_t>(kTileT, bn - tb));
    const int t0 = static_cast<int>(b * bt + tb);
    // A tile's share of the next rows, scales included: the whole head for the block's last tile.
    const size_t pf_begin = tb * pf_pace, pf_end = tb + kTileT >= bn ? head_bytes : (tb + n) * pf_pace;
    const bool own_values = kv.layout == KvLayout::kSideBySide;
    const NextShare next(kn, own_values ? vb : vn, pf_begin, pf_end, SplitOfFetch<NQ>(hd, kv.layout),
                         gs.fetch_to);
    if (sealed) {
      if constexpr (!kQ4)
        ScoreSealedQ8<NQ>(dk, reinterpret_cast<const int8_t*>(kd), reinterpret_cast<const uint16_t*>(kb), tb,
                          static_cast<size_t>(n), bt, hd, st.qq, st.s, next);
    } else if constexpr (kQ4) {
      const auto* ks = reinterpret_cast<const uint16_t*>(kb);
      if (gfni) {  // never off AVX3_DL (KeyNibblesByGfni)
        ScoreTileQ4<NQ, FD_X86_VNNI != 0>(dk, kd, ks, tb, static_cast<size_t>(n), hd, st.qq, st.s, next);
      } else {
        ScoreTileQ4<NQ, false>(dk, kd, ks, tb, static_cast<size_t>(n), hd, st.qq, st.s, next);
      }
    } else {
      FetchBoth next_keys = next.Phase(0, static_cast<size_t>(n + 3) / 4);
      for (int t = 0; t < n; t += 4) {
        next_keys.Next();
        size_t rows[4];
        for (int i = 0; i < 4; ++i) rows[i] = tb + static_cast<size_t>(std::min(t + i, n - 1));
        const size_t col = static_cast<size_t>(t);  // scores of rows >= n are set to -inf later
        ScoreQuadQ8<NQ>(dk, reinterpret_cast<const int8_t*>(kd), hd, rows, reinterpret_cast<const uint16_t*>(kb),
                        st.qq, st.s, col);
      }
    }
    MaskInvisible<NQ>(st.s, tile.limit, st.min_limit, t0, n);
    // Value weights: probability * the row's (q8) or the row and group's (q4) scale; zero
    // beyond the tile's n rows, whose scales may be anything.
    const size_t LT = hn::Lanes(dt);
    constexpr int chunks = kTileT / static_cast<int>(hn::MaxLanes(dt));
    hn::Vec<decltype(dt)> scale[kQ4 ? kMaxGroups : 1][chunks];
    float smax[kQ4 ? kMaxGroups : 1];
    // The tile's scales (ScaleAt).
    const auto* sc = reinterpret_cast<const uint16_t*>(vb) + (kQ4 ? detail::q4_scale_index(tb, 0, groups) : tb);
    const size_t stride = kQ4 ? groups * kQ4ScaleRows : kQ4ScaleRows;
    for (size_t g = 0; g < (kQ4 ? groups : 1); ++g) {
      for (int c = 0; c < chunks; ++c) {
        const size_t t = static_cast<size_t>(c) * LT;
        const auto live = hn::FirstN(dt, static_cast<size_t>(std::max(0, n - static_cast<int>(t))));
        scale[g][c] = hn::IfThenElseZero(live, LoadF16(dt, ScaleAt(sc, stride, g, t)));
      }
    }
    LargestScales(sc, stride, kQ4 ? groups : 1, n, smax);
    FetchBoth while_rounding = next.Phase(1, chunks);
    FoldTileToWeights<kQ4, NQ, chunks>(dt, df, n, kQ4 ? groups : 1, scale, smax, hd, st, tw, while_rounding);
    const int n_quads = (n + 3) / 4;
    if constexpr (kQ4) {
      // Units per pass; a pass keeps 2 * CQ * NQ sums. Three or four queries: at CQ 2 as many as
      // AVX2 has registers, and CQ 1 read hd64 and hd128 GQA 4 3-6 % faster there (one core, KV in
      // L2, AMD EPYC Zen 3, concurrent A/B). One query: CQ 4 on AVX2 (8 sums; CQ 8's 16 sums
      // took all its registers) read hd128 GQA 1 14.2 -> 16.0 GB/s, hd64 12.5 -> 12.8 (same setup,
      // best of 5).
      constexpr int CQ = NQ == 1 ? (HWY_TARGET <= HWY_AVX3 ? 8 : 4)
                                 : NQ == 2 ? 4 : (NQ <= 4 && HWY_TARGET <= HWY_AVX3) ? 2 : 1;
      const size_t units = hd / (2 * L);
      const uint8_t* quads = vd + tb / 4 * groups * 64;
#if FD_Q4_INT16_SUMS
      constexpr int kRun = kQ4Int16Quads;
#else
      constexpr int kRun = kTileT / 4;
#endif
      FetchBoth fetch = next.Phase(2, CountPasses<CQ, 2>(units, 1) * static_cast<size_t>(n_quads));
      for (int k0 = 0; k0 < n_quads; k0 += kRun) {
        ForEachPass<CQ, 2>(units, 1, [&](size_t u, auto width) {
          AccumulateQuadsQ4<NQ, decltype(width)::value>(df, quads, groups, k0, std::min(n_quads, k0 + kRun), tw, u,
                                                        st.acc, fetch);
        });
      }
    } else {
      constexpr int CQ = NQ <= 2 ? 8 : NQ <= 4 ? 4 : 2;  // chunks per pass
      const auto* chunks_at = reinterpret_cast<const int8_t*>(vd);
      FetchBoth fetch = next.Phase(2, CountPasses<CQ, 2>(hd, L) * static_cast<size_t>(n_quads));
      ForEachPass<CQ, 2>(hd, L, [&](size_t c, auto width) {
        constexpr int CU = decltype(width)::value;
        if (hd % kQ8ValueChunk == 0) {
          AccumulateQuadsQ8<NQ, CU, true>(df, chunks_at, hd, bt, tb / 4, n_quads, tw, c, st.acc, fetch);
        } else {
          AccumulateQuadsQ8<NQ, CU, false>(df, chunks_at, hd, bt, tb / 4, n_quads, tw, c, st.acc, fetch);
        }
      });
    }
  }
}

// Attention of a group of tiles, block-major (BlockVisits); each tile's arithmetic is
// the same as when it runs alone.
template <bool kQ4, int NQ, class DK, class DF>
HWY_NOINLINE void AttendGroupQuant(DK dk, DF df, const Tile* tiles, const int* kv_heads, int n_tiles,
                                   const KvBlocks& kv, size_t head_bytes, int head_dim) {
  const size_t hd = static_cast<size_t>(head_dim);
  const size_t bt = static_cast<size_t>(kv.block_tokens);
  QuantTileState<kQ4, NQ> st[kMaxGroupQ / NQ];
  size_t blocks[kMaxGroupQ / NQ] = {};
  for (int i = 0; i < n_tiles; ++i) {
    for (int j = 0; j < NQ; ++j) {
      QuantizeQuery<kQ4>(tiles[i].q[j], hd, st[i].qq[j]);
      for (size_t c = 0; c < hd; ++c) st[i].acc[j][c] = 0.0f;
      st[i].m[j] = -std::numeric_limits<float>::infinity();
      st[i].l[j] = 0.0f;
      st[i].max_limit = std::max(st[i].max_limit, tiles[i].limit[j]);
      st[i].min_limit = j == 0 ? tiles[i].limit[j] : std::min(st[i].min_limit, tiles[i].limit[j]);
    }
    st[i].head_off = static_cast<size_t>(kv_heads[i]) * kv_head_stride(kv.layout, head_bytes);
    blocks[i] = (static_cast<size_t>(st[i].max_limit) + bt - 1) / bt;
  }
  const GroupShape gs = GroupShapeOf<kQ4>(head_bytes, bt, hd);
  // About kPrefetchBytes of K and V in flight: small heads (q4 hd64) are fetched further ahead.
  const int ahead = visits_ahead(kPrefetchBytes, head_bytes);
  FetchFirstKeys(blocks, n_tiles, ahead, head_bytes, gs.fetch_to,
                 [&](int i, size_t b) { return Bytes(kv.k[b]) + st[i].head_off; });
  for (BlockVisits v(blocks, n_tiles, ahead); v.Next();) {
    const int i = v.tile(), ai = v.ahead_tile();
    const uint8_t* kn = ai < 0 ? nullptr : Bytes(kv.k[v.ahead_block()]) + st[ai].head_off;
    const uint8_t* vn = ai < 0 ? nullptr : Bytes(kv.v[v.ahead_block()]) + st[ai].head_off;
    AttendBlockQuant<kQ4, NQ>(dk, df, tiles[i], kv, gs, v.block(), hd, st[i], kn, vn);
  }
  for (int i = 0; i < n_tiles; ++i)
    for (int j = 0; j < NQ; ++j) {
      StoreNormalized(df, st[i].acc[j], st[i].l[j], hd, tiles[i].out[j]);
      StoreStats(tiles[i], j, st[i].m[j], st[i].l[j]);
    }
}

template <bool kQ4, class DK, class DF>
void RunQuantGroup(DK dk, DF df, const Tile* t, const int* kvh, int n, const KvBlocks& kv, size_t hb, int hd) {
  switch (t[0].n) {
    case 1: return AttendGroupQuant<kQ4, 1>(dk, df, t, kvh, n, kv, hb, hd);
    case 2: return AttendGroupQuant<kQ4, 2>(dk, df, t, kvh, n, kv, hb, hd);
    case 3: return AttendGroupQuant<kQ4, 3>(dk, df, t, kvh, n, kv, hb, hd);
    case 4: return AttendGroupQuant<kQ4, 4>(dk, df, t, kvh, n, kv, hb, hd);
    case 5: return AttendGroupQuant<kQ4, 5>(dk, df, t, kvh, n, kv, hb, hd);
    case 6: return AttendGroupQuant<kQ4, 6>(dk, df, t, kvh, n, kv, hb, hd);
    case 7: return AttendGroupQuant<kQ4, 7>(dk, df, t, kvh, n, kv, hb, hd);
    default: return AttendGroupQuant<kQ4, 8>(dk, df, t, kvh, n, kv, hb, hd);
  }
}

// Picks the widest vectors whose chunks divide the head.
void RunGroupAnyWidth(const Tile* t, const int* kvh, int n, const KvBlocks& kv, size_t hb, int head_dim) {
  const size_t hd = static_cast<size_t>(head_dim);
  if (kv.dtype == KvDtype::q4) {
    // Key vectors of four bytes of up to a key group's keys.
    const hn::CappedTag<uint8_t, 4 * kQ4KeyGroup> dk;
    return RunQuantGroup<true>(dk, hn::CappedTag<float, 16>(), t, kvh, n, kv, hb, head_dim);
  }
  const hn::CappedTag<float, 16> df;
  const hn::Repartition<int16_t, decltype(df)> dk;
  if (hd % hn::Lanes(dk) == 0) return RunQuantGroup<false>(dk, df, t, kvh, n, kv, hb, head_dim);
  if (hd % 8 == 0) {
    const hn::CappedTag<float, 4> df4;  // 4 floats, 8 int16: every target has them
    return RunQuantGroup<false>(hn::Repartition<int16_t, decltype(df4)>(), df4, t, kvh, n, kv, hb, head_dim);
  }
  for (int i = 0; i < n; ++i) AttendTileScalar(t[i], kv, hb, kvh[i], head_dim);
}

#else  // HWY_TARGET == HWY_SCALAR

void RunGroupAnyWidth(const Tile* t, const int* kvh, int n, const KvBlocks& kv, size_t hb, int head_dim) {
  for (int i = 0; i < n; ++i) AttendTileScalar(t[i], kv, hb, kvh[i], head_dim);
}

#endif  // HWY_TARGET != HWY_SCALAR

// Attention of all query rows and heads that read kv heads [kvh_begin, kvh_end).
void AttendQuantHeadsImpl(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                          const AttnDims& dims, int kvh_begin, int kvh_end, float* out, float* stats) {
  for_each_tile_group(q, n_q, q_pos0, dims, kvh_begin, kvh_end, out, stats,
                      [&](const Tile* tiles, const int* kvh, int n) {
                        RunGroupAnyWidth(tiles, kvh, n, kv, head_bytes, dims.head_dim);
                      });
}

// The layout the q8 kernel reads fastest on this CPU for head blocks of head_bytes (the store's
// choice, KvFormat::layout): KvLayout::kSideBySide where SideBySideReadsFaster, for blocks of 8 KiB
// or more (hd128 at 64-token pages), whose tiles then fetch their own values while they score
// (kFetchOwnValues). AMD EPYC (Zen 5), KV in 2 MiB pages, from memory (4 layers), one process
// switching between an apart store and a side-by-side one, 10-12 alternating pairs of passes,
// median ratio of adjacent passes, side by side against apart:
// - q8 hd128 (8.3 KiB): 2 threads beside the slow stream (42-44 GB/s) GQA 4 1.13x as fast (ctx
//   4096 batch 16), 1.11x (ctx 512 batch 64), 1.12x (ctx 8192), GQA 2 1.06x, GQA 8 1.04x, GQA 1
//   1.01-1.03x; beside the fast stream (66-73 GB/s) GQA 4 1.14x, GQA 1 1.06x; one thread GQA 4
//   1.14x, GQA 2 1.11x, GQA 1 1.03-1.09x.
// - Smaller blocks read faster so beside the slow stream only: q8 hd64 (4.2 KiB) 1.04-1.10x there,
//   0.92-0.96x beside the fast one and on one thread; q4 hd128 (4.6 KiB) 1.04-1.17x and 0.93-0.96x.
//   q4 hd64 (2.3 KiB) 0.69-0.79x everywhere: too little time to fetch a block while it is scored.
//   So those, and q4, keep kApart.
constexpr size_t kSideBySideMinHeadBytes = size_t(8) << 10;
KvLayout Q8LayoutImpl(size_t head_bytes) {
  return SideBySideReadsFaster() && head_bytes >= kSideBySideMinHeadBytes ? KvLayout::kSideBySide : KvLayout::kApart;
}

}  // namespace HWY_NAMESPACE
}  // namespace fd::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fd::kernels {

HWY_EXPORT(AttendQuantHeadsImpl);
HWY_EXPORT(Q8LayoutImpl);

KvLayout q8_layout(size_t head_bytes) { return HWY_DYNAMIC_DISPATCH(Q8LayoutImpl)(head_bytes); }

namespace detail {
void attend_quant_heads(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                        const AttnDims& d, int kvh_begin, int kvh_end, float* out, float* stats) {
  HWY_DYNAMIC_DISPATCH(AttendQuantHeadsImpl)(q, n_q, q_pos0, kv, head_bytes, d, kvh_begin, kvh_end, out, stats);
}
}  // namespace detail

}  // namespace fd::kernels
#endif  // HWY_ONCE
