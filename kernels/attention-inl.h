// Per-target building blocks shared by the fp16 (kernels/attention.cc) and quantized
// (kernels/attention_quant.cc) attention kernels; include inside a foreach_target translation unit.
#if defined(FD_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FD_KERNELS_ATTENTION_INL_H_
#undef FD_KERNELS_ATTENTION_INL_H_
#else
#define FD_KERNELS_ATTENTION_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "kernels/attention.h"
#include "kernels/attention_tile.h"

HWY_BEFORE_NAMESPACE();
namespace fd::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether this CPU is one where the kernels read KvLayout::kSideBySide faster than kApart, each
// tile fetching its own visit's values while it scores its keys: AMD with AVX-512 (Zen 4, not
// measured, and Zen 5). Measurements at F16LayoutImpl (kernels/attention.cc) and Q8LayoutImpl
// (kernels/attention_quant.cc).
HWY_INLINE bool SideBySideReadsFaster() { return __builtin_cpu_is("amd") && HWY_TARGET <= HWY_AVX3; }

template <class P>
HWY_INLINE const uint8_t* Bytes(const P* p) {
  return static_cast<const uint8_t*>(static_cast<const void*>(p));
}

// dst row r [0, n) = src [r * stride, r * stride + n) and dst row r [n, row_bytes) = 0, for rows
// r < rows, dst rows row_bytes apart (a multiple of a vector); src is readable for `readable` bytes
// from its start. A block's last, partial key group is scored from such a zero-padded copy. Row
// by row through memcpy (and std::copy), the copy of hd128 took about as long as reading the
// block's keys: see ScoreKeys (kernels/attention.cc). Here every chunk of a row whose whole vector
// is readable is one load, blend and store; only the last few rows go byte by byte.
template <class D8>
HWY_INLINE void CopyRowsZeroPadded(D8 d8, const uint8_t* src, size_t stride, size_t n, size_t rows,
                                   size_t readable, size_t row_bytes, uint8_t* dst) {
  const size_t L = hn::Lanes(d8);
  for (size_t r = 0; r < rows; ++r) {
    const uint8_t* from = src + r * stride;
    uint8_t* to = dst + r * row_bytes;
    for (size_t c = 0; c < row_bytes; c += L) {
      const size_t live = n > c ? std::min(n - c, L) : 0;
      if (r * stride + c + L <= readable) {
        hn::StoreU(hn::IfThenElseZero(hn::FirstN(d8, live), hn::LoadU(d8, from + c)), d8, to + c);
      } else {
        for (size_t i = 0; i < L; ++i) to[c + i] = i < live ? from[c + i] : 0;
      }
    }
  }
}

// The lane-wise combinations the reductions below take, and each one's reduction of a whole vector.
struct AddOp {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Add(a, b);
  }
  template <class D>
  static HWY_INLINE hn::Vec<D> OfLanes(D d, hn::Vec<D> v) {
    return hn::SumOfLanes(d, v);
  }
};
struct MaxOp {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Max(a, b);
  }
  template <class D>
  static HWY_INLINE hn::Vec<D> OfLanes(D d, hn::Vec<D> v) {
    return hn::MaxOfLanes(d, v);
  }
};

#if HWY_TARGET != HWY_SCALAR
// Combines the 128-bit blocks of v: lane i of the result is op over lane i of every block.
template <class Op = AddOp, class D>
HWY_INLINE auto FoldBlocks(D d, hn::Vec<D> v, Op op = {}) {
  if constexpr (hn::MaxLanes(D()) * sizeof(hn::TFromD<D>) > 16) {
    const hn::Half<D> dh;
    return FoldBlocks(dh, op(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), op);
  } else {
    (void)d;
    return v;
  }
}

// Lane i of block b of the result = op over the lanes of block b of a_i (4-lane blocks).
template <class Op = AddOp, class D>
HWY_INLINE hn::Vec<D> Combine4InBlocks(D d, hn::Vec<D> a0, hn::Vec<D> a1, hn::Vec<D> a2, hn::Vec<D> a3, Op op = {}) {
  const hn::Repartition<uint64_t, D> d64;
  const auto x01 = op(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const auto x23 = op(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto lo = hn::InterleaveLower(d64, hn::BitCast(d64, x01), hn::BitCast(d64, x23));
  const auto hi = hn::InterleaveUpper(d64, hn::BitCast(d64, x01), hn::BitCast(d64, x23));
  return op(hn::BitCast(d, lo), hn::BitCast(d, hi));
}
#endif

// out[j] = op over the lanes of a[j] (fp32). Four vectors at a time are transposed-and-combined
// within each 128-bit block, then the blocks are folded: about a third of the work of four
// reductions. Reduced one query at a time, a tile's maxima (TileMaxima) and sums
// (FoldDenominators) took about 17 % of the samples in int4 hd64 GQA 4's per-block loop (Intel
// Xeon, AVX-512, KV in cache).
template <int NQ, class Op = AddOp, class D>
HWY_INLINE void ReduceLanes(D d, const hn::Vec<D>* a, float* out, Op op = {}) {
  (void)op;
  int j = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (NQ >= 4 && hn::MaxLanes(D()) >= 4) {
    for (; j + 4 <= NQ; j += 4) {
      const auto r = FoldBlocks(d, Combine4InBlocks(d, a[j], a[j + 1], a[j + 2], a[j + 3], op), op);
      hn::StoreU(r, hn::DFromV<decltype(r)>(), out + j);
    }
  }
#endif
  for (; j < NQ; ++j) out[j] = hn::GetLane(Op::OfLanes(d, a[j]));
}

// Vectors of keys scored per pass: the largest power of two w with w * nq sums at most `sums` and
// w at most `tile` vectors (1 at least), so that the passes of a tile's last keys can halve it.
constexpr int VectorsPerPass(int sums, int nq, int tile) {
  int w = 1;
  while (2 * w * nq <= sums && 2 * w <= tile) w *= 2;
  return w;
}

// Walks the keys [t, n) of a tile that starts at key tb of a block whose first `full` keys fill
// whole key groups: passes of W vectors of L keys while they stay among those, then of W / 2, ...
// 1 vectors, calling pass(t, std::integral_constant<int, width>); then tail(t) for the keys left.
// A vector stays inside one key group when L divides the group.
template <int W, class Pass, class Tail>
HWY_INLINE void ForEachKeyPass(size_t t, size_t tb, size_t n, size_t full, size_t L, const Pass& pass,
                               const Tail& tail) {
  const size_t n_up = (n + L - 1) / L * L;
  for (; t + W * L <= n_up && tb + t + W * L <= full; t += W * L) pass(t, std::integral_constant<int, W>());
  if constexpr (W > 1) {
    ForEachKeyPass<W / 2>(t, tb, n, full, L, pass, tail);
  } else if (t < n) {
    tail(t);
  }
}

// out[0, hd) = acc[0, hd) / l: a query's finished output (acc aligned, hd a multiple of Lanes(d)).
template <class D>
HWY_INLINE void StoreNormalized(D d, const float* HWY_RESTRICT acc, float l, size_t hd,
                                float* HWY_RESTRICT out) {
  const auto inv = hn::Set(d, 1.0f / l);
  for (size_t c = 0; c < hd; c += hn::Lanes(d)) hn::StoreU(hn::Mul(hn::Load(d, acc + c), inv), d, out + c);
}

// How PacedPrefetch fetches: into L1 (prefetcht0), into L2 (prefetcht1), or non-temporal
// (prefetchnta: into L1 with as little of the other levels as the CPU allows, since attention
// reads each row once).
enum class FetchTo { kL1, kL2, kNonTemporal };

// Whether every kernel fetches the next rows into L2 (prefetcht1), whatever the head's size and
// queries: on AMD with AVX-512 of family 19h (Zen 4; Zen 5 is family 1Ah and keeps the choices of
// NarrowHeadFetch and WideHeadFetch in kernels/attention.cc, and L1 for the quantized kernels).
// AMD EPYC (Zen 4: family 19h model 11h, L1 32 KiB, L2 1 MiB; 2 vCPUs whose stream read swung
// between 26 and 56 GB/s), 2 threads, from memory, one build switching by an environment variable,
// 3 alternating runs (fp16 ctx 512/4096 x batch 16/64, quantized ctx 4096 x batch 16/64), median
// GB/s per shape, the range over shapes, before -> after: fp16 hd64 GQA 1 21.2-24.1 -> 27.4-28.9,
// GQA 4 17.1-20.5 -> 26.8-28.6, GQA 8 10.8-17.7 -> 18.1-19.4, hd128 GQA 1 22.5-24.0 -> 29.4-35.8,
// GQA 4 17.7-19.7 -> 28.7-33.0, GQA 8 16.0-17.0 -> 19.0-20.0; int8 GQA 1 and 4 15.9-26.3 ->
// 28.0-34.3, GQA 8 16.8-18.7 -> 16.4-26.5; int4 hd64 GQA 1 24.8-26.2 -> 26.9-28.5, GQA 4 (its
// arithmetic's pace) 17.6-20.0 -> 20.2-20.6, GQA 8 11.5-11.6 -> 8.9-13.8, hd128 GQA 1 19.9-20.7 ->
// 29.0-33.3, GQA 4 17.1-17.3 -> 23.7-24.5, GQA 8 12.4-12.7 -> 14.3-16.1. Batches of 1 and 4
// (ctx 512/4096, 2 alternating runs) gained about as much; a prompt's attention (fastdecode-bench
// prefill, fp16, 512 tokens, 3 alternating runs) took 27.6-31.1 ms on one thread against
// 29.5-30.5. Before this, fp16 into L1 (prefetcht0) read within 3 % of prefetchnta; fetching 2, 4
// or 8 times as far ahead in L2 read within that host's noise. Switching between calls of one
// run, L2 against the fetches before read 0.57-0.69x the time, far more than whole runs show.
HWY_INLINE bool FetchesIntoL2() { return __builtin_cpu_is("amdfam19h") && HWY_TARGET <= HWY_AVX3; }

// A fetch (PacedPrefetch's interface) that fetches nothing: its calls compile to nothing.
struct NoFetch {
  HWY_INLINE void Next() {}
  HWY_INLINE void Fine() {}
};

// Fetches bytes [begin, end) after base into the cache over `slices` calls of Next(), the same
// number of lines per call, so that the requests do not arrive in one burst; a null base, or a
// range of no line, fetches nothing and costs Next() one test. Every call issues that number of
// fetches, the calls after the last line fetching it again: a loop that stopped at the range's end
// ran a trip count that changed within each phase, a branch the CPU likely mispredicted (the guest
// below has no counters to show it), where a repeated fetch of a cached line costs one instruction.
// AMD EPYC (Zen 4), int4 hd64 GQA 4, one core, KV in L2 (--ctx 512 --batch 2 --cold-size 0), one
// build switching between the two, pairs of adjacent runs, medians: 1.03x as fast (7 pairs at the
// core's faster speed, about 14.3 GB/s) and 1.07x (7 pairs at its slower, about 9 GB/s), where
// fetching nothing read 1.03x (one pair) and 1.20x (7 pairs). From memory (2 threads, hd 64/128,
// GQA 1/4, ctx 4096 batch 16 and 64, ctx 512 batch 64), 5-14 alternating pairs of runs against the
// build before beside the same stream (below 40 GB/s), medians per shape: int4 1.02-1.09x as fast
// (hd64 GQA 4 ctx 512 1.18x, hd128 GQA 4 there 0.91x and, in 12 more pairs, 1.00x), fp16
// 0.97-1.08x, int8 0.97-1.06x.
class PacedPrefetch {
 public:
  PacedPrefetch(const uint8_t* base, size_t begin, size_t end, size_t slices, FetchTo to = FetchTo::kL1)
      : base_(base), at_(begin / 64 * 64), to_(to) {
    const size_t lines = end > at_ ? (end - at_ + 63) / 64 : 0;
    per_ = slices > 0 ? std::max<size_t>(1, (lines + slices - 1) / slices) : lines;
    last_ = lines > 0 ? at_ + (lines - 1) * 64 : at_;
    if (lines == 0) base_ = nullptr;
  }
  HWY_INLINE void Next() {
    if (base_ == nullptr) return;
    if (to_ == FetchTo::kL1) {
      Issue<3>();
    } else if (to_ == FetchTo::kL2) {
      Issue<2>();
    } else {
      Issue<0>();
    }
  }

 private:
  template <int kLocality>
  HWY_INLINE void Issue() {
    for (size_t r = 0; r < per_; ++r) {
      __builtin_prefetch(base_ + at_, 0, kLocality);
      at_ = std::min(at_ + 64, last_);
    }
  }
  const uint8_t* base_;
  size_t at_, last_ = 0, per_ = 0;  // bytes after base_: the next line, the range's last line
  FetchTo to_;
};

// Fetches the keys (bytes [0, head_bytes) of the K head block) of a group's first `visits` visits
// (BlockVisits over blocks[0, n_tiles)), all at once, before the first is scored: every later visit
// is fetched `visits` visits ahead of it, but no visit fetches these, and the demand loads alone
// waited on the hardware prefetcher, which ramps up anew on every head block. k_rows(tile, block)
// gives a visit's K head block. Their values are left to the visits (see the fetch splits). AMD
// EPYC (Zen 4), 2 threads, --ctx 512 --batch 64 (8 blocks a sequence), 3 sets of 16-24
// alternating pairs of runs against the build before, median ratio within the pairs beside the
// same (30-34 GB/s) stream, per set: fp16 hd64 GQA 1 1.012/1.015/1.035x as fast, GQA 4
// 1.026/1.031/0.988x, hd128 GQA 1 1.014/1.022/1.006x, GQA 4 1.017/1.006/0.989x; int4 (one set)
// hd64 GQA 1 1.034x, GQA 4 0.996x (paced by its arithmetic), hd128 1.008x and 1.026x. A gain of
// about 1 %, near this guest's noise: there a change that read no faster in a later set measured
// 1.006-1.035x in its first. Fetching the values too (fp16, 14 pairs) read 0.988-1.000x as fast.
template <class KRows>
HWY_INLINE void FetchFirstKeys(const size_t* blocks, int n_tiles, int visits, size_t head_bytes, FetchTo to,
                               const KRows& k_rows) {
  BlockVisits v(blocks, n_tiles, 0);
  for (int d = 0; d < visits && v.Next(); ++d) PacedPrefetch(k_rows(v.tile(), v.block()), 0, head_bytes, 1, to).Next();
}

// The next visit's K and V fetched together, each over the same `slices` calls of Next(), paced
// by one phase of a tile. Key dimensions and value rows are walked by ForEachPaced, which calls
// Next() once per step of a few and Fine() at the others; Fine() fetches only when `fine`, and
// then the phase's slices count every dimension or row (see PaceEveryLine).
struct FetchBoth {
  PacedPrefetch k, v;
  bool fine = false;
  HWY_INLINE void Next() {
    k.Next();
    v.Next();
  }
  HWY_INLINE void Fine() {
    if (fine) Next();
  }
};

// Calls body(i) for i in [0, n), unrolled in steps of Step, with fetch.Next() before the first
// index of every step and fetch.Fine() before the others.
template <size_t Step, class Fetch, class Body>
HWY_INLINE void ForEachPaced(size_t n, Fetch& fetch, const Body& body) {
  size_t i = 0;
  for (; i + Step <= n; i += Step) {
#pragma GCC unroll 8
    for (size_t u = 0; u < Step; ++u) {
      if (u == 0) {
        fetch.Next();
      } else {
        fetch.Fine();
      }
      body(i + u);
    }
  }
  for (size_t u = i; u < n; ++u) {
    if (u == i) {
      fetch.Next();
    } else {
      fetch.Fine();
    }
    body(u);
  }
}

// The fetch steps (slices of a PacedPrefetch) that ForEachPaced makes over n in steps of `step`.
HWY_INLINE size_t PacedSteps(size_t n, size_t step, bool fine) { return fine ? n : (n + step - 1) / step; }

// The byte offset `tenths` tenths of the way from begin to end, down to a cache line (end itself
// for 10): where a tile's phases cut their share [begin, end) of the next visit's rows.
HWY_INLINE size_t CutTenths(size_t begin, size_t end, size_t tenths) {
  return tenths >= 10 ? end : (begin + (end - begin) * tenths / 10) / 64 * 64;
}

// Walks [0, n) in passes: of Wide steps of `step` while they fit, then (when Wide > Mid) of Mid,
// then single steps, calling pass(at, std::integral_constant<int, width>) for each. The value
// kernels accumulate a row this way; a first walk with a counting pass paces their prefetch.
template <int Wide, int Mid, class Pass>
HWY_INLINE void ForEachPass(size_t n, size_t step, const Pass& pass) {
  size_t at = 0;
  for (; at + Wide * step <= n; at += Wide * step) pass(at, std::integral_constant<int, Wide>());
  if constexpr (Wide > Mid) {
    for (; at + Mid * step <= n; at += Mid * step) pass(at, std::integral_constant<int, Mid>());
  }
  for (; at < n; at += step) pass(at, std::integral_constant<int, 1>());
}

template <int Wide, int Mid>
HWY_INLINE size_t CountPasses(size_t n, size_t step) {
  size_t passes = 0;
  ForEachPass<Wide, Mid>(n, step, [&](size_t, auto) { ++passes; });
  return passes;
}

// acc[j][c, c + CB * L) += sum over the n rows of w[j][t] * v_t[c, c + CB * L), where
// rows.Load(d, t, c) gives elements [c, c + Lanes(d)) of value row t as fp32: CB chunks per pass
// so that each weight broadcast feeds CB independent FMA chains.
// w: [NQ][>= n] softmax weights; acc: [NQ][>= c + CB * L]. The rows are walked by ForEachPaced
// in steps of kUnrollRows (see AttendBlock).
constexpr size_t kUnrollRows = 4;

template <int NQ, int CB, class Rows, class D, class WRow, class AccRow, class Fetch>
HWY_INLINE void AccumulateRows(D d, const Rows& rows, size_t row0, int n, const WRow* w, size_t c,
                               AccRow* acc, Fetch& fetch) {
  using V = hn::Vec<D>;
  const size_t L = hn::Lanes(d);
  V a[CB][NQ];
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 8
    for (int b = 0; b < CB; ++b) a[b][j] = hn::Load(d, acc[j] + c + b * L);
  const auto row = [&](size_t t) HWY_ATTR {
    V v[CB];
#pragma GCC unroll 8
    for (int b = 0; b < CB; ++b) v[b] = rows.Load(d, row0 + t, c + b * L);
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j) {
      const V wt = hn::Set(d, w[j][t]);
#pragma GCC unroll 8
      for (int b = 0; b < CB; ++b) a[b][j] = hn::MulAdd(wt, v[b], a[b][j]);
    }
  };
  // kUnrollRows rows per step, unrolled: row by row, the counters and the branches took 5
  // instructions per 8 FMAs at four queries per kv head, and one core read hd64 GQA 4 (L2-hot) at
  // 7.4 GB/s against 8.6 unrolled.
  ForEachPaced<kUnrollRows>(static_cast<size_t>(n), fetch, row);
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 8
    for (int b = 0; b < CB; ++b) hn::Store(a[b][j], d, acc[j] + c + b * L);
}

// Prefill's causal mask over a tile of scores s[j][0, n) for keys t0..t0+n-1: s[j][t] = -inf
// where query j must not see key t0 + t (t0 + t >= limit[j]). Keys [0, min_limit) are visible
// to every query, so a tile below it is left as it is.
template <int NQ, size_t T>
HWY_INLINE void MaskInvisible(float (*s)[T], const int* limit, int min_limit, int t0, int n) {
  if (t0 + n <= min_limit) return;
  for (int j = 0; j < NQ; ++j)
    for (int t = std::max(0, limit[j] - t0); t < n; ++t) s[j][t] = -std::numeric_limits<float>::infinity();
}

constexpr float kLog2E = 1.442695040888963407359924681f;  // log2(e)

#if HWY_TARGET <= HWY_AVX3
// ExpNonPositive<true> on AVX-512: exp(x) for x <= 0 in 6 instructions instead of 11, and to 8.9e-5
// relative error (over 7.3 million values in [-87.3, 0]) instead of 1.3e-4. t = x log2(e) and
// 2^t = 2^(t - floor t) * 2^floor(t): the first factor a cubic on [0, 1] (minimax in relative
// error, 8.56e-5, with p(0) = 1 exactly), the second applied by vscalefps, which gives 0 for
// t = -inf (whose vreduceps is 0), at most FLT_MIN below t = -126, and keeps a NaN. Intel Xeon
// (AVX-512 VNNI), 2 threads, ctx 4096, batch 16, KV from memory, two builds in one process, median
// ratios of 30-40 adjacent passes: int4 hd64 GQA 4 1.02 and 1.03x as fast, GQA 8 1.04x, GQA 1
// 1.01x, hd128 1.00-1.01x; int8 hd64 GQA 4 1.03x, GQA 1 1.03x, hd128 GQA 4 1.01x.
HWY_INLINE __m512 ReduceFloor(__m512 t) { return _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
HWY_INLINE __m256 ReduceFloor(__m256 t) { return _mm256_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
HWY_INLINE __m128 ReduceFloor(__m128 t) { return _mm_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
HWY_INLINE __m512 ScaleByPow2(__m512 p, __m512 t) { return _mm512_scalef_ps(p, t); }
HWY_INLINE __m256 ScaleByPow2(__m256 p, __m256 t) { return _mm256_scalef_ps(p, t); }
HWY_INLINE __m128 ScaleByPow2(__m128 p, __m128 t) { return _mm_scalef_ps(p, t); }

// kDegree 6 (ExpWeights): 2^f by a degree-6 polynomial (interpolating 2^f at the 7 Chebyshev
// nodes of [0, 1]; 6.0e-9 relative error with these fp32 coefficients) in 11 instructions. Its
// error then comes from rounding t: within 1.8 ulp on [-1, 0] and 8.9e-8 (1 + |x|) relative
// everywhere (every fp32 x in [-87.3, 0] against exp in double).
// Pow2Scalef(d, t) is that 2^t, t = x log2(e), for a caller that folds the multiply by log2(e)
// into arithmetic of its own; ExpNonPositiveScalef(d, x) = exp(x) multiplies first.
template <int kDegree = 3, class D>
HWY_INLINE hn::Vec<D> Pow2Scalef(D d, hn::Vec<D> t) {
  static_assert(kDegree == 3 || kDegree == 6, "a cubic or a degree-6 polynomial");
  const hn::Vec<D> f{ReduceFloor(t.raw)};  // t - floor(t), in [0, 1]
  hn::Vec<D> p;
  if constexpr (kDegree == 3) {
    p = hn::MulAdd(hn::Set(d, 0.07706703990697861f), f, hn::Set(d, 0.22764499485492706f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.6951167583465576f));
  } else {
    p = hn::MulAdd(hn::Set(d, 0.00021865784947294742f), f, hn::Set(d, 0.0012391331838443875f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.009684186428785324f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.055480629205703735f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.24023045599460602f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.6931469440460205f));
  }
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  const hn::Vec<D> r{ScaleByPow2(p.raw, t.raw)};
  if constexpr (kDegree == 3) return r;
  // 0 below t = -126 (x < -87.3), as ExpNonPositive gives, not a subnormal: subnormal weights in
  // the value sums may cost microcode assists on Intel. A NaN t compares false and stays NaN.
  return hn::IfThenZeroElse(hn::Lt(t, hn::Set(d, -126.0f)), r);
}
template <int kDegree = 3, class D>
HWY_INLINE hn::Vec<D> ExpNonPositiveScalef(D d, hn::Vec<D> x) {
  return Pow2Scalef<kDegree>(d, hn::Mul(x, hn::Set(d, kLog2E)));
}
#endif

// exp(x) for x <= 0, -inf included (a softmax weight): hn::Exp's reduction and polynomial, but
// 2^n is applied with one multiply-add, since x <= 0 needs none of hn::Exp's range handling;
// x < -87.7 gives 0 (exp(x) < 2^-126 there). About half of hn::Exp's instructions: hn::Exp was 15 %
// of fp16 attention at hd64, GQA 4 (KV in L2, AMD EPYC Zen 3). Over 10^9 values in [-100, 0] it
// erred by at most 0.98 ulp, hn::Exp by 1.03 (AVX2).
// kCoarse: to 1.3e-4 relative error instead (a degree-3 polynomial fitted to e^r's relative error
// on |r| <= ln 2 / 2, which is 1.23e-4, and ln 2 in one part), for the quantized formats, which
// round each weight to 8 bits next (an error of up to 2e-3 of the tile's largest). Their fold is a
// chain of dependent multiply-adds per query; shortening it, on AMD EPYC (Zen 5):
// - KV in L2 (--ctx 512 --batch 2 --cold-size 0), two copies at once, one core each, 4 pairs:
//   int4 hd64 GQA 4 1.07-1.12x as fast, GQA 1 1.06-1.07x, hd128 1.03-1.08x; int8 1.02-1.10x.
// - From memory (--threads 2 --ctx 4096 --batch 16,64), one build switching between the two, 4
//   alternating runs, medians: int4 hd64 GQA 4 20.2 -> 23.3 and 20.7 -> 24.3 GB/s, GQA 1 33.7 ->
//   41.5 and 37.2 -> 42.7; int8 hd64 GQA 4 33.8 -> 40.3 and 35.6 -> 40.8; hd128 within +-6 %.
// AVX-512 targets take ExpNonPositiveScalef for it.
template <bool kCoarse = false, class D>
HWY_INLINE hn::Vec<D> ExpNonPositive(D d, hn::Vec<D> x) {
#if HWY_TARGET <= HWY_AVX3
  if constexpr (kCoarse) return ExpNonPositiveScalef(d, x);
#endif
  const hn::RebindToSigned<D> di;
  // Not Max: which operand it returns for a NaN differs by target (the scalar one drops the NaN),
  // and a NaN score must stay NaN.
  const auto lowest = hn::Set(d, -88.0f);
  x = hn::IfThenElse(hn::Lt(x, lowest), lowest, x);
  // n = round(x / ln 2) lands in the low mantissa bits of t: 1.5 * 2^23 has an ulp of 1.
  const auto magic = hn::Set(d, 12582912.0f);
  const auto t = hn::MulAdd(x, hn::Set(d, kLog2E), magic);
  const auto n = hn::Sub(t, magic);
  hn::Vec<D> em1;  // e^r - 1
  if constexpr (kCoarse) {
    const auto r = hn::MulAdd(n, hn::Set(d, -0.693147180559945309f), x);
    const auto p = hn::MulAdd(hn::Set(d, 0.16662642890226997f), r, hn::Set(d, 0.5039411850974486f));
    em1 = hn::MulAdd(p, hn::Mul(r, r), r);
  } else {
    auto r = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), x);  // ln 2 in two parts (Cody-Waite)
    r = hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), r);
    auto p = hn::Set(d, 0.000198527617612853646278381f);
    p = hn::MulAdd(p, r, hn::Set(d, 0.00139304355252534151077271f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.00833336077630519866943359f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.0416664853692054748535156f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.166666671633720397949219f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
    em1 = hn::MulAdd(p, hn::Mul(r, r), r);
  }
  // 2^n: bits(t) = 0x4B400000 + n, so n + 127 goes to the exponent field (n = -127 gives 0).
  const auto scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127 - 0x4B400000))));
  return hn::MulAdd(em1, scale, scale);
}

// exp(x) for x <= kSoftmaxSlack as the fp16 kernel computes its softmax weights:
// ExpNonPositiveScalef<6> on AVX-512 (like ExpNonPositive, 0 below -87.3 and for -inf, and a NaN
// kept), ExpNonPositive elsewhere (both hold above 0 too: their reductions and 2^n do not assume
// x <= 0 beyond ExpNonPositive's clamp below). A weight then errs by at most 8.9e-8 (1 + |x|) e^x,
// at most 8.0e-7 of the largest weight e^8: a few units of fp32 roundoff. AMD EPYC (Zen 5), fp16,
// median ratios of tokens/s against ExpNonPositive (with the rescaling's exp one query at a time),
// one build switching by an environment variable, 4 alternating runs:
// - KV in L2 (--threads 1 --ctx 512 --batch 2 --cold-size 0): hd64 GQA 1 1.044, GQA 4 1.023,
//   GQA 8 1.013, hd128 0.994, 1.010, 1.014. Two builds compared so read 0.95-1.03: code placement.
// - From memory, before the zeroing below -87.3 (two instructions): one thread (ctx 4096, batch
//   16) hd64 1.006, 1.016, 1.029, hd128 1.003, 1.010, 1.009; 2 threads (ctx 512 and 4096, batch 16
//   and 64, GQA 1 and 4, 8 runs, pairs in the same stream mode) 0.97-1.04 per cell, hd64 GQA 1
//   beside the slow stream at the low end (0.97-0.98).
// The coarse cubic (ExpNonPositive<true>) read hd64 GQA 4 1.04-1.07x as fast from memory, but
// moved stories260K's logits by up to 1.06e-3 of their range against the fp32 reference.
template <class D>
HWY_INLINE hn::Vec<D> ExpWeights(D d, hn::Vec<D> x) {
#if HWY_TARGET <= HWY_AVX3
  return ExpNonPositiveScalef<6>(d, x);
#else
  return ExpNonPositive(d, x);
#endif
}

// Each query's running max folded with its largest score of a tile s[j][0, tile) whose first n
// are real (the rest are set to -inf here), tile a multiple of Lanes(dt): m_new[j] = max(m[j],
// tile_max[j]).
template <int NQ, class DT, class SRow>
HWY_INLINE void TileMaxima(DT dt, SRow* HWY_RESTRICT s, int n, size_t tile, const float* m, float* tile_max,
                           float* m_new) {
  using VT = hn::Vec<DT>;
  const size_t LT = hn::Lanes(dt);
  VT vmax[NQ];
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j) {
    for (size_t t = static_cast<size_t>(n); t < tile; ++t) s[j][t] = -std::numeric_limits<float>::infinity();
    vmax[j] = hn::Load(dt, s[j]);
  }
  for (size_t t = LT; t < tile; t += LT)
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j) vmax[j] = hn::Max(vmax[j], hn::Load(dt, s[j] + t));
  ReduceLanes<NQ>(dt, vmax, tile_max, MaxOp());
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j) m_new[j] = std::max(m[j], tile_max[j]);
}

// out[j] = exp(a[j] - b[j]) for N values a[j] <= b[j] + kSoftmaxSlack, and 0 where b[j] is -inf:
// four at a time in vectors (ExpNonPositive, which holds above 0 too; see ExpWeights) when 4
// divides N, where a std::exp call per value took about 5 % of int4 hd64 GQA 4 attention (Intel
// Xeon, AVX-512, KV in cache).
template <int N>
HWY_INLINE void ExpOfDifferences(const float* a, const float* b, float* out) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
#if HWY_TARGET != HWY_SCALAR
  if constexpr (N % 4 == 0) {
    const hn::Full128<float> d4;
    const auto vinf = hn::Set(d4, neg_inf);
    for (int j = 0; j < N; j += 4) {
      const auto va = hn::LoadU(d4, a + j), vb = hn::LoadU(d4, b + j);
      const auto x = hn::IfThenElse(hn::Eq(vb, vinf), vinf, hn::Sub(va, vb));
      hn::StoreU(ExpNonPositive(d4, x), d4, out + j);
    }
    return;
  }
#endif
  for (int j = 0; j < N; ++j) out[j] = b[j] == neg_inf ? 0.0f : std::exp(a[j] - b[j]);
}

// The end of an online-softmax step whose weights exp(s - m_new[j]) sum to the lanes of vsum[j]:
// l[j] = l[j] * exp(m[j] - m_new[j]) + that sum, acc[j] [hd] rescaled alike, m[j] = m_new[j]. A
// query with no key visible yet (m_new -inf) keeps m, l and acc.
template <int NQ, class DT, class D, class AccRow>
HWY_INLINE void FoldDenominators(DT dt, D d, const hn::Vec<DT>* vsum, const float* m_new, float* m, float* l,
                                 AccRow* HWY_RESTRICT acc, size_t hd) {
  const size_t L = hn::Lanes(d);
  float sums[NQ];
  ReduceLanes<NQ>(dt, vsum, sums);
  // exp(m - m_new): four queries at a time in one vector where 4 divides NQ, where a std::exp call
  // per query whose max had grown took 1.9 % of fp16 hd64 GQA 4 (KV in L2, AMD EPYC Zen 5); the
  // quantized kernels' folds come here too. Otherwise one query at a time, and only where its max
  // grew (ExpOfDifferences would call std::exp for every query).
  float corr[NQ];
  if constexpr (NQ % 4 == 0) {
    ExpOfDifferences<NQ>(m, m_new, corr);
  } else {
    for (int j = 0; j < NQ; ++j) corr[j] = m[j] == m_new[j] ? 1.0f : std::exp(m[j] - m_new[j]);
  }
  for (int j = 0; j < NQ; ++j) {
    if (m_new[j] == -std::numeric_limits<float>::infinity()) continue;
    l[j] = l[j] * corr[j] + sums[j];
    if (corr[j] != 1.0f) {
      const auto vc = hn::Set(d, corr[j]);
      for (size_t c = 0; c < hd; c += L) hn::Store(hn::Mul(hn::Load(d, acc[j] + c), vc), d, acc[j] + c);
    }
    m[j] = m_new[j];
  }
}

// Whether the step keeps every query's reference m: its tile max lies at most kSoftmaxSlack above
// m[j] (false for a NaN max, which takes the full step, and where m[j] is -inf and the tile has a
// visible key).
template <int NQ>
HWY_INLINE bool KeepsReferences(const float* tile_max, const float* m) {
  bool keep = true;
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j) keep &= tile_max[j] <= m[j] + kSoftmaxSlack;
  return keep;
}

// The end of an online-softmax step whose weights, taken relative to m (keep) or to m_new, sum to
// the lanes of vsum[j]: where the step keeps m, l[j] += that sum; otherwise FoldDenominators moves
// m to m_new and rescales l and acc.
template <int NQ, class DT, class D, class AccRow>
HWY_INLINE void EndSoftmaxStep(DT dt, D d, bool keep, const hn::Vec<DT>* vsum, const float* m_new, float* m,
                               float* l, AccRow* HWY_RESTRICT acc, size_t hd) {
  if (HWY_LIKELY(keep)) {
    float sums[NQ];
    ReduceLanes<NQ>(dt, vsum, sums);
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j) l[j] += sums[j];
    return;
  }
  FoldDenominators<NQ>(dt, d, vsum, m_new, m, l, acc, hd);
}

// s[j][0, tile) = exp(s[j] - ref[j]) (ExpWeights), their sums in the lanes of vsum[j]; a query
// whose ref is -inf (it has seen no key yet) gets weights of zero. fetch.Next() once per
// Lanes(dt) keys.
template <int NQ, class DT, class SRow, class Fetch>
HWY_INLINE void WeighTile(DT dt, SRow* HWY_RESTRICT s, size_t tile, const float* ref, hn::Vec<DT>* vsum,
                          Fetch& fetch) {
  using VT = hn::Vec<DT>;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t LT = hn::Lanes(dt);
  VT vm[NQ];
#pragma GCC unroll 8
  for (int j = 0; j < NQ; ++j) {
    vm[j] = hn::Set(dt, ref[j] == neg_inf ? 0.0f : ref[j]);  // such a query's weights are reset below
    vsum[j] = hn::Zero(dt);
  }
  for (size_t t = 0; t < tile; t += LT) {
    fetch.Next();
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j) {
      const auto p = ExpWeights(dt, hn::Sub(hn::Load(dt, s[j] + t), vm[j]));  // exp(-inf) = 0
      hn::Store(p, dt, s[j] + t);
      vsum[j] = hn::Add(vsum[j], p);
    }
  }
  for (int j = 0; j < NQ; ++j)
    if (ref[j] == neg_inf) {
      std::fill(s[j], s[j] + tile, 0.0f);
      vsum[j] = hn::Zero(dt);
    }
}

// The online-softmax step of NQ queries over a tile of scores s[j][0, tile) whose first n are real
// (the rest are set to -inf here), tile a multiple of Lanes(dt): turns s[j] into the weights
// exp(s - m[j]), adds their sum to the running denominator l[j], and, where a query's tile max
// exceeds m[j] by more than kSoftmaxSlack (or m[j] is -inf), first moves m[j] to its max and
// rescales l[j] and acc[j] [hd] by exp(m_old - m_new). So m is a reference the weights are taken
// relative to, not always the largest score, and l and acc stay consistent with it: the output
// acc / l and the merge of key ranges (StoreStats) hold for any such m. In most tiles no m moves,
// a branch that is predicted, and the exponentials wait on m alone, not on the tile's maxima. AMD
// EPYC (Zen 5), one build switching between this and moving m to the max in every tile on
// alternate calls, median ratio of adjacent calls: KV in L2 (--threads 1 --ctx 512 --batch 2
// --cold-size 0) hd64 GQA 4 1.081x as fast (quartiles 1.063-1.100), GQA 1 1.029x, hd128 GQA 4
// 1.029x, GQA 1 1.019x; from memory (ctx 4096), one thread 0.990-1.021x, 2 threads (stream at
// 51-60 GB/s, batch 16 and 64) 0.973-1.028x, where the reads set the pace.
// A query with no key visible yet gets weights of zero and keeps m, l and acc.
// The queries go through each step together: one by one, the reductions' latencies were not
// hidden, and the fold took 15-24 % of GQA 4 attention at hd64 (KV in L2, AMD EPYC Zen 3).
// fetch.Next() once per Lanes(dt) keys.
template <int NQ, class DT, class D, class SRow, class AccRow, class Fetch>
HWY_INLINE void SoftmaxFoldTiles(DT dt, D d, SRow* HWY_RESTRICT s, int n, size_t tile, float* m, float* l,
                                 AccRow* HWY_RESTRICT acc, size_t hd, Fetch& fetch) {
  float tile_max[NQ], m_new[NQ];
  TileMaxima<NQ>(dt, s, n, tile, m, tile_max, m_new);
  const bool keep = KeepsReferences<NQ>(tile_max, m);
  hn::Vec<DT> vsum[NQ];
  WeighTile<NQ>(dt, s, tile, keep ? m : m_new, vsum, fetch);
  EndSoftmaxStep<NQ>(dt, d, keep, vsum, m_new, m, l, acc, hd);
}

}  // namespace HWY_NAMESPACE
}  // namespace fd::kernels
HWY_AFTER_NAMESPACE();

#endif  // FD_KERNELS_ATTENTION_INL_H_
