#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/attention_tile.h"
#include "kernels/attention_units.h"
#include "kernels/kv_format.h"
#include "kernels/thread_pool.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "kernels/attention-inl.h"
#include "kernels/f16-inl.h"

#ifndef FD_KERNELS_ATTENTION_TILE_
#define FD_KERNELS_ATTENTION_TILE_
namespace fd::kernels {
namespace {

// Keys scored per softmax step: each step reduces, exponentiates and rescales per query, so longer
// tiles cost less per key. On AMD EPYC (Zen 3, AVX2), one thread, ctx 512, KV hot in cache, A/B
// medians of 7 runs: 64 against 16 read hd64 GQA 1 23.5 against 19.4 GB/s, hd128 GQA 1 19.1
// against 15.2, hd64 GQA 4 7.8 against 7.0, hd128 GQA 4 8.8 against 7.5.
constexpr int kTileT = 64;
constexpr int kMaxHeadDim = 256;

}  // namespace
}  // namespace fd::kernels
#endif  // FD_KERNELS_ATTENTION_TILE_

HWY_BEFORE_NAMESPACE();
namespace fd::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// How the next visit's rows are fetched: into L1 while a visit's K and V and the next visit's
// (4 head blocks) fit in this; beyond it (hd128 at 64-token blocks), rows fetched into L1 were
// evicted before use, and WideHeadFetch says how. On an Intel Xeon (Sapphire Rapids, L1 48 KiB),
// 2 threads, prefetcht1 read hd128 7-9 % faster than prefetcht0 (GQA 1 1153-1181 -> 1233-1281
// tokens/s, GQA 4 1021-1072 -> 1104-1147); hd64 (32 KiB) gained nothing at GQA 1 and lost 5 % at
// GQA 4. Head blocks within it are fetched as NarrowHeadFetch says.
constexpr size_t kL1FetchBytes = size_t(32) << 10;

// Whether a visit's K and V and the next visit's (4 head blocks of head_bytes) fit kL1FetchBytes.
HWY_INLINE bool FourHeadBlocksFitL1(size_t head_bytes) { return 4 * head_bytes <= kL1FetchBytes; }

// K and V bytes fetched ahead of the visit being read: 32 KiB on AMD without AVX-512 (Zen 3), 16
// elsewhere, so that hd64 (16 KiB of K and V per visit at 64-token blocks) fetches two visits ahead
// on Zen 3 and one on Intel and on AMD with AVX-512 (Zen 4, see FetchesIntoL2, and Zen 5), and
// hd128 one on all.
// - AMD EPYC (Zen 3), 2 threads, from memory, A/B in one process (40-60 alternating passes,
//   median time ratios), two visits ahead against one: hd64 GQA 4 read 1.02-1.08x as fast (8
//   sets, ctx 512/4096, batch 16/64), GQA 1 and 2 0.94-1.03x (10 sets, 7 of them at 0.99-1.03),
//   GQA 8 0.99x; hd128 0.99-1.03x at GQA 4, and three ahead no better than two.
// - Intel Xeon (AVX-512 FP16, L1 48 KiB, 2 of its cores), hd64, ctx 512/4096 x batch 16/64, two
//   sets of 5 and 6 alternating runs: one visit ahead read 0.98-1.17x as fast as two (14 of 16
//   set medians above 1; GQA 1 ctx 4096 1.05-1.17x, GQA 4 1.00-1.08x). The builds before and
//   after, 5 alternating runs of the same 16 shapes with hd128 too: hd64's fraction of the stream
//   read 1.02-1.09x (medians), hd128's (which did not change) 0.99-1.03x. In 4 runs of ctx 4096
//   batch 16, 64 and 128 KiB ahead read 0.99-1.10x as fast as 32, inside that host's noise.
// - AMD EPYC (Zen 5, L1 48 KiB), from memory, one build switching between passes (30 alternating
//   pairs, median ratio of adjacent passes), one visit ahead against two, 2 threads: hd64 GQA 1
//   1.025-1.035x as fast (ctx 4096 batch 16 and 64, ctx 512 batch 64), GQA 2 1.015x, GQA 4
//   1.015-1.021x, GQA 8 1.006x; hd128 (one visit either way) 1.000x; one thread: GQA 1 1.086x,
//   GQA 4 0.995x.
HWY_INLINE size_t FetchAheadBytes() {
  return __builtin_cpu_is("amd") && HWY_TARGET > HWY_AVX3 ? size_t(32) << 10 : size_t(16) << 10;
}

// How a tile's share of the next visit's rows is cut between its phases: tenths of the K and of
// the V fetched while its keys are scored and while its softmax is folded; the rest of each while
// its values are summed. own_values: the V fetched is the tile's own visit's, not the next one's.
struct FetchSplit {
  size_t key_tenths_scoring, key_tenths_folding, value_tenths_scoring, value_tenths_folding;
  bool own_values = false;
};
// On AMD without AVX-512 (Zen 3), for tiles of up to four queries. Fetching nothing while folding,
// memory idled through the fold, about a sixth of GQA 4's time. AMD EPYC (Zen 3), 2 threads, from
// memory, A/B in one process (40 alternating passes over 4 layers, median time ratios) against
// {10, 0, 0, 0}: hd64 GQA 4 ctx 4096 batch 16 1.12x as fast (other splits with K 5-8 and V 0-3
// while folding 1.01-1.11x, V 4 1.02x), batch 64 1.10x, ctx 512 batch 64 1.10x, GQA 1 1.09x, GQA 2
// 1.08x; hd128 (fetched with prefetchnta then, see WideHeadFetch) GQA 4 0.98-1.05x in 6 sets, GQA 1
// 1.03-1.05x. GQA 8 read 0.97x as fast, so tiles of more queries keep {10, 0, 0, 0}.
constexpr FetchSplit kFetchWhileFolding = {7, 3, 0, 3};
constexpr FetchSplit kFetchOutsideFold = {10, 0, 0, 0};
// Off AMD, for tiles of one query, and of up to four whose head blocks are fetched into L2 (hd128;
// hd64 at two to four queries takes kFetchAroundFold): a share of both the K and the V in every
// phase (on AMD with AVX-512 see kFetchSpread below). Intel Xeon (AVX-512 FP16, 2 of its cores),
// from memory (ctx 4096 batch 16, 4 layers, 537 MB), two builds in one process, 30 alternating
// passes each, median ratio of adjacent passes against {7, 3, 3, 3} (which had read 1.03-1.10x as
// fast as {7, 3, 0, 3} at GQA 4 there): hd64 GQA 4 1.076 (quartiles 1.06-1.09), GQA 1 1.078, hd128
// GQA 4 1.098, GQA 1 1.099; ctx 512 batch 64 hd64 GQA 4 1.052. Other splits with K while summing,
// hd64 GQA 4: {5, 2, 3, 3} 1.04-1.09, {5, 1, 3, 3} 1.10, {4, 1, 3, 3} 1.06, {3, 2, 2, 2} 1.06,
// {6, 2, 3, 3} 1.04; 11 splits with none read 0.85-1.04.
constexpr FetchSplit kFetchInAllPhases = {4, 2, 3, 3};
// Off AMD, for head blocks fetched into L1 (hd64 at 64-token blocks) at two to four queries: half
// of the K and of the V while scoring and the other half while summing, none in the fold, whose few
// steps fetched in bursts. Intel Xeon (AVX-512 FP16), from memory (ctx 4096, batch 16), after
// the fetch was paced every dimension and row, one core each, two copies at once, cores swapped,
// 2 pairs against kFetchInAllPhases: hd64 GQA 2 1.078x and 1.081x as fast, GQA 4 1.051x and
// 1.054x; GQA 1 0.974x and 0.985x and hd128 GQA 4 0.961x and 0.965x, which keep it.
constexpr FetchSplit kFetchAroundFold = {5, 0, 5, 0};
// On AMD with AVX-512 (Zen 4, not measured, and Zen 5), for tiles of any number of queries: three
// tenths of both the K and the V while scoring, two while folding and the other half while summing.
// AMD EPYC (Zen 5), from memory, fetching one visit ahead (FetchAheadBytes), one build switching
// splits between passes, 16-24 alternating pairs, median ratio of adjacent passes against the
// splits before ({4, 2, 2, 3} for one or two queries, which had read hd64 GQA 1 1.12-1.13x as fast
// as {7, 3, 0, 3} two visits ahead; {7, 3, 0, 3} for three or four; {10, 0, 0, 0} for more), 2
// threads:
// - stream at 42-46 GB/s: hd64 GQA 4 1.054x as fast (ctx 4096 batch 16), hd128 GQA 4 1.025x, GQA 1
//   1.033-1.035x (ctx 512 batch 64 1.034x), GQA 2 1.043x; hd64 GQA 1 0.996-0.999x, GQA 2 0.995x.
// - stream at 48-59 GB/s: hd64 GQA 4 1.037-1.064x (ctx 4096 batch 16 and 64, ctx 512 batch 64),
//   hd128 GQA 4 (ctx 512 batch 64) 1.073x, hd64 GQA 8 1.052x, GQA 1 and 2 1.005-1.006x; hd128
//   GQA 8 1.010x.
// - one thread: hd64 GQA 4 1.064x, hd128 GQA 1 1.047x, hd64 GQA 1 0.991x.
// Around it, hd64 GQA 4: {4, 2, 4, 2} 1.040x, {4, 2, 3, 3} 1.018x, {3, 3, 3, 3} 1.016x,
// {2, 2, 2, 2} and {3, 1, 3, 1} 0.971x, {5, 3, 0, 2} 0.982x; hd128 GQA 1: {3, 2, 2, 2} 1.011x,
// {3, 3, 3, 2} 1.015x, {2, 2, 3, 2} 1.004x, {2, 2, 2, 2} 0.994x.
constexpr FetchSplit kFetchSpread = {3, 2, 3, 2};

// Fetching the tile's own values while it scores, and the next visit's keys while it folds (two
// tenths) and sums: one visit ahead, a visit and the rows fetched for the next take 4 head blocks,
// and this 3. For head blocks fetched into L1 whose 4 overflow it (hd128 at 64-token blocks, 64
// KiB against 48) at two to four queries, on AMD with AVX-512. AMD EPYC (Zen 5), from memory, one
// build switching between passes (16-20 alternating pairs, median ratio of adjacent passes)
// against kFetchSpread, hd128, 2 threads: GQA 4 1.042x as fast (ctx 4096 batch 16), 1.053x
// (batch 64), 1.028x (ctx 512 batch 64); GQA 2 1.052x, 1.024x (ctx 512 batch 64); one thread GQA 4
// 1.010x, GQA 2 1.108x. All of the next keys while summing: GQA 4 1.024-1.050x, GQA 2 1.084x (and
// 0.98x against this); GQA 8 0.990x, so more queries keep kFetchSpread. With the KV in L2 1.007x.
constexpr FetchSplit kFetchOwnValues = {0, 2, 10, 0, true};

// The split of a tile of nq queries whose head blocks of head_bytes are fetched `to`, laid out as
// `layout` says.
HWY_INLINE FetchSplit FetchSplitFor(int nq, size_t head_bytes, FetchTo to, KvLayout layout) {
  const bool amd = __builtin_cpu_is("amd");
  if (amd && HWY_TARGET <= HWY_AVX3) {
    if (layout == KvLayout::kSideBySide) return kFetchOwnValues;
    const bool wide_into_l1 = to == FetchTo::kL1 && !FourHeadBlocksFitL1(head_bytes);
    return wide_into_l1 && nq >= 2 && nq <= 4 ? kFetchOwnValues : kFetchSpread;
  }
  if (nq > 4) return kFetchOutsideFold;
  if (amd) return kFetchWhileFolding;
  return nq >= 2 && to == FetchTo::kL1 ? kFetchAroundFold : kFetchInAllPhases;
}

// prefetchnta on AMD, prefetcht1 elsewhere. fastdecode-bench attention --head-dim 128 --kv-dtype
// f16 --ctx 512,4096 --batch 16,64, 2 alternating runs, GB/s:
// - AMD EPYC (Zen 5), 2 threads: prefetchnta read GQA 1 8-13 % faster than prefetcht1
//   (36.9-39.9 -> 39.9-44.8), GQA 4 36.3-38.4 -> 36.9-40.6.
// - Intel Xeon (Emerald Rapids, 16 cores), 16 threads: prefetchnta read 2.5 times slower than
//   prefetcht1 (GQA 1 88-107 -> 39-43, GQA 4 81-100 -> 37-40; prefetcht0 86-100 and 76-94), and
//   8 threads alike (52-73 -> 22-32).
// Tiles of several queries on AMD fetch into L1 after all, since the fetch split above: AMD EPYC
// (Zen 3), 2 threads, from memory, each build A/B in one process against the same base (40
// passes, median time ratios), prefetcht0 read hd128 GQA 4 ctx 4096 batch 16 1.07-1.08x as fast
// as prefetchnta (two sets), batch 64 1.07x, ctx 512 batch 64 1.04x, and GQA 1 1.00x and 0.99x,
// so one query keeps prefetchnta (Zen 5 not measured since).
HWY_INLINE FetchTo WideHeadFetch(int nq) {
  if (!__builtin_cpu_is("amd")) return FetchTo::kL2;
  return nq == 1 ? FetchTo::kNonTemporal : FetchTo::kL1;
}

// prefetchnta on AMD with AVX-512 (Zen 5; Zen 4 fetches into L2, FetchesIntoL2) for tiles of up to
// four queries, prefetcht0 elsewhere. AMD EPYC (Zen 5), hd64, from memory, one build switching
// between passes (16-20 alternating pairs, median ratio of adjacent passes) against prefetcht0, 2
// threads: GQA 1 1.029-1.043x as fast (ctx 4096 batch 16), 1.014-1.022x (batch 64), 1.035-1.050x
// (ctx 512 batch 64), 1.070x (ctx 2048), 1.033x (ctx 8192); GQA 2 1.043-1.045x, 1.109x (ctx 512
// batch 64); GQA 3 1.022x; GQA 4 1.019-1.032x, 1.012-1.024x (batch 64), 1.023x (ctx 512 batch 64);
// GQA 8 0.968-1.006x, so more queries keep prefetcht0. One thread: GQA 1 1.028x, GQA 2 1.041x,
// GQA 4 0.998x. With the KV in L3 (ctx 128, one thread) GQA 1 read 0.95x as fast. Before
// kFetchSpread, prefetchnta had read GQA 4 4-13 % slower there. The quantized kernels read the same
// either way (q8 and q4, hd64 and hd128, GQA 1 and 4: 0.977-1.027x).
HWY_INLINE FetchTo NarrowHeadFetch(int nq) {
  return __builtin_cpu_is("amd") && HWY_TARGET <= HWY_AVX3 && nq <= 4 ? FetchTo::kNonTemporal : FetchTo::kL1;
}

// Whether the next visit's rows are fetched before every key dimension and value row (FetchBoth's
// Fine()), a line or two at a time, or before every kFetchDims dimensions and kUnrollRows rows.
// Intel Xeon (AVX-512 FP16), from memory (ctx 4096, batch 16), one core each, two copies at once,
// cores swapped: every line against the coarse steps (with hd64's page touches then) read hd64
// GQA 1 1.23x as fast, GQA 4 1.16x, hd128 GQA 1 1.09x, GQA 4 1.01x; a sum of fp16 lines with
// attention's arithmetic per byte (one core) read 0.56-0.74x as fast with bursts of 2 to 16
// prefetches as with one a line. AMD EPYC (Zen 5) went the other way: 2 threads, from memory
// (ctx 4096, batch 16 and 64), 3 alternating runs, fractions of the stream (medians, the stream at
// 30-67 GB/s): every line read hd64 GQA 1 0.80-0.82 against 0.99-1.05 for the coarse steps, GQA 4
// 0.62-0.63 against 0.76-0.80, hd128 GQA 1 0.63-0.68 against 0.77-0.93, GQA 4 0.57-0.59 against
// 0.67-0.71 (e784be8, before every line: 0.88-0.91, 0.77-0.78, 0.80, 0.71-0.74).
HWY_INLINE bool PaceEveryLine() { return !__builtin_cpu_is("amd"); }

// Row readers: Load(d, t, c) returns elements [c, c + Lanes(d)) of row t of one kv head's key or
// value block as fp32, for c a multiple of Lanes(d). Layouts are documented in kernels/kv_format.h.
struct F16Rows {  // a block not yet full
  const uint16_t* x;  // [block_tokens][head_dim]
  size_t hd;
  F16Rows(const uint8_t* head_block, size_t head_dim, size_t)
      : x(reinterpret_cast<const uint16_t*>(head_block)), hd(head_dim) {}
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D d, size_t t, size_t c) const {
    return LoadF16(d, x + t * hd + c);
  }
};
// The values of a sealed block; kWhole: head_dim is a multiple of kF16ValueChunk, so that every
// chunk's rows are 16 apart (a width computed per load read hd64 GQA 1 about 5 % slower).
template <bool kWhole>
struct F16ValueChunks {
  const uint16_t* x;  // chunks of kF16ValueChunk elements, each [block_tokens][16]
  size_t hd, bt;
  F16ValueChunks(const uint8_t* head_block, size_t head_dim, size_t block_tokens)
      : x(reinterpret_cast<const uint16_t*>(head_block)), hd(head_dim), bt(block_tokens) {}
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D d, size_t t, size_t c) const {
    if constexpr (kWhole) {
      const size_t c0 = c / kF16ValueChunk * kF16ValueChunk;
      return LoadF16(d, x + c0 * bt + t * kF16ValueChunk + (c - c0));
    }
    return LoadF16(d, x + detail::f16_sealed_value_index(t, c, hd, bt));
  }
};

// Key rows scored per pass when keys are stored row by row: TP * NQ independent FMA chains, 8 from
// NQ = 2 on, as two FMA pipes of 4 cycles' latency need (NQ = 1 reads too little per byte to be
// compute-bound). One core of AMD EPYC (Zen 3), hd64, L2-hot, medians of 6 alternating runs: GQA 2
// read 14.0 GB/s with 4 rows against 12.7 with 2; GQA 4 7.4 with 2 rows against 6.8 with 1.
template <int NQ>
constexpr int RowsPerPass() {
  return NQ <= 2 ? 4 : NQ <= 4 ? 2 : 1;
}

// sums[p * NQ + j] = q_j . k_(row0 + p) for TP consecutive key rows: each q chunk is loaded
// once for TP rows, and the TP * NQ accumulators are independent FMA chains.
template <int NQ, int TP, class Rows, class D>
HWY_INLINE void ScoreRows(D d, const Rows& kr, size_t row0, const float (*qs)[kMaxHeadDim], size_t hd,
                          float* sums) {
  using V = hn::Vec<D>;
  const size_t L = hn::Lanes(d);
  V a[TP * NQ];
#pragma GCC unroll 16
  for (int i = 0; i < TP * NQ; ++i) a[i] = hn::Zero(d);
  if (NQ == 1 && hd >= 128) {
    // Rows in memory order, as the hardware prefetcher wants them: at one query per kv head and
    // hd 128, attention read about 25 % faster from memory on one core (as fast from cache). At
    // hd 64 or with more queries the chunk-major order below is faster from cache, no slower from
    // memory.
#pragma GCC unroll 4
    for (int p = 0; p < TP; ++p)
      for (size_t c = 0; c < hd; c += L) a[p] = hn::MulAdd(hn::Load(d, qs[0] + c), kr.Load(d, row0 + p, c), a[p]);
    return ReduceLanes<TP * NQ>(d, a, sums);
  }
#pragma GCC unroll 2
  for (size_t c = 0; c < hd; c += L) {
    V k[TP];
#pragma GCC unroll 4
    for (int p = 0; p < TP; ++p) k[p] = kr.Load(d, row0 + static_cast<size_t>(p), c);
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j) {
      const V qv = hn::Load(d, qs[j] + c);
#pragma GCC unroll 4
      for (int p = 0; p < TP; ++p) a[p * NQ + j] = hn::MulAdd(qv, k[p], a[p * NQ + j]);
    }
  }
  ReduceLanes<TP * NQ>(d, a, sums);
}

// s[j][t] = q_j . k_(tb + t) for the keys t in [0, n) of a tile whose keys are stored row by row
// (a block not yet full), TP rows per pass; fetch.Next() once per pass.
template <int NQ, class Rows, class D, class Fetch>
HWY_INLINE void ScoreTileRows(D d, const Rows& kr, size_t tb, int n, const float (*qs)[kMaxHeadDim], size_t hd,
                              float (*s)[kTileT], Fetch& fetch) {
  constexpr int TP = RowsPerPass<NQ>();
  for (int t = 0; t < n;) {
    fetch.Next();
    float sums[TP * NQ];
    const int rows = t + TP <= n ? TP : 1;  // the last rows of a block go one at a time
    if (rows == TP)
      ScoreRows<NQ, TP>(d, kr, tb + static_cast<size_t>(t), qs, hd, sums);
    else
      ScoreRows<NQ, 1>(d, kr, tb + static_cast<size_t>(t), qs, hd, sums);
    for (int p = 0; p < rows; ++p)
#pragma GCC unroll 8
      for (int j = 0; j < NQ; ++j) s[j][t + p] = sums[p * NQ + j];
    t += rows;
  }
}

// Prefetch steps of ScoreTileRows for a tile of n keys: its passes.
template <int NQ>
constexpr size_t TileRowSteps(int n) {
  return static_cast<size_t>(n / RowsPerPass<NQ>() + n % RowsPerPass<NQ>());
}

// Keys of one kv head's full block are stored transposed (kv_format.h), so that a vector holds one
// element of Lanes consecutive keys: a tile's scores come out key by key in lanes, with no
// horizontal sum per key and query (with row-major keys those sums took 17 % of hd64 GQA 4). AMD
// EPYC (Zen 3), one core, KV in L2 (ctx 512 hd64, ctx 256 hd128, 2 kv heads), medians of 10
// alternating runs against row-major keys: hd64 GQA 1 18.1 -> 22.1 GB/s, GQA 2 12.9 -> 14.1, GQA 4
// 8.6 -> 10.3, GQA 8 5.0 -> 5.0; hd128 GQA 1 14.7 -> 24.4 (5 runs).
// They are transposed in groups of kF16KeyGroup keys, [head_dim][16] each, and the values sealed
// in chunks of kF16ValueChunk elements, [block_tokens][16] each, so that a pass of 16 keys (or 16
// value elements) reads one run of memory: with the whole block transposed ([head_dim]
// [block_tokens]) and values row by row, a pass read 32 bytes of every 128 (hd64), and at GQA 4,
// where the FMAs leave the loads little room, the memory fell behind. AMD EPYC (Zen 3), 2 threads,
// from memory, ctx 512/4096 x batch 16/64, medians of 5 alternating runs: GQA 4 read 13.3-16.7 ->
// 16.2-18.0 GB/s; GQA 1 (8 runs) hd128 18.7-20.3 -> 19.7-20.6, hd64 19.3-21.1 -> 18.8-20.3.

// Key vectors scored per pass: KeyVectors * NQ accumulators, independent FMA chains (two FMA pipes
// of 4 cycles' latency need 8), within the register file (16 vectors; 32 on AVX-512) and a tile.
template <int NQ, class D>
constexpr int KeyVectors() {
  return VectorsPerPass(HWY_TARGET <= HWY_AVX3 ? 16 : 8, NQ, static_cast<int>(kTileT / hn::MaxLanes(D())));
}

// Keys of a sealed block of bt keys that fill whole key groups.
HWY_INLINE size_t GroupedKeys(size_t bt) { return bt / kF16KeyGroup * kF16KeyGroup; }

// Dimensions per prefetch step of a scoring pass (ForEachPaced).
constexpr size_t kFetchDims = 8;

// s[j][t, t + W * L) = q_j . k for the W * L keys from key `key` of a sealed block whose kv head's
// keys start at kt (in full key groups, [head_dim][16] each), fetching in steps of kFetchDims.
template <int NQ, int W, class D, class Fetch>
HWY_INLINE void ScoreKeyVectors(D d, const uint16_t* HWY_RESTRICT kt, size_t key, size_t bt,
                                const float (*qs)[kMaxHeadDim], size_t hd, float (*s)[kTileT],
                                size_t t, Fetch& fetch) {
  using V = hn::Vec<D>;
  const size_t L = hn::Lanes(d);
  const uint16_t* k0[W];  // dimension 0 of each vector's keys
#pragma GCC unroll 16
  for (int w = 0; w < W; ++w) k0[w] = kt + detail::f16_sealed_key_index(key + static_cast<size_t>(w) * L, 0, hd, bt);
  V a[W * NQ];
#pragma GCC unroll 16
  for (int i = 0; i < W * NQ; ++i) a[i] = hn::Zero(d);
  const auto dim = [&](size_t i) HWY_ATTR {
    V k[W];
#pragma GCC unroll 16
    for (int w = 0; w < W; ++w) k[w] = LoadF16(d, k0[w] + i * kF16KeyGroup);
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) {
      const V qv = hn::Set(d, qs[j][i]);
#pragma GCC unroll 16
      for (int w = 0; w < W; ++w) a[w * NQ + j] = hn::MulAdd(qv, k[w], a[w * NQ + j]);
    }
  };
  ForEachPaced<kFetchDims>(hd, fetch, dim);
#pragma GCC unroll 16
  for (int w = 0; w < W; ++w)
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) hn::StoreU(a[w * NQ + j], d, s[j] + t + static_cast<size_t>(w) * L);
}

// Prefetch steps of ScoreKeys for a tile.
template <int NQ, class D>
HWY_INLINE size_t ScoreKeySteps(D d, size_t tb, size_t n, size_t bt, size_t hd, bool fine) {
  const size_t L = hn::Lanes(d);
  size_t passes = 0;
  ForEachKeyPass<KeyVectors<NQ, D>()>(0, tb, n, GroupedKeys(bt), L, [&](size_t, auto) { ++passes; }, [](size_t) {});
  return passes * PacedSteps(hd, kFetchDims, fine);
}

// s[j][t] = q_j . k_(tb + t) for the keys t in [0, n) of a tile (kt: the kv head's sealed keys).
// Lanes past n within a key group are scored too and left for the softmax to drop.
// The block's last key group, narrower than kF16KeyGroup when block_tokens is not a multiple of
// it, is copied into a whole one, zero-padded (CopyRowsZeroPadded), and scored by the same
// vectors. Intel Xeon, 2 threads, hd128, batch 16, alternating runs, fraction of the stream read
// with --block-tokens 60 and 72: GQA 4 0.19-0.29 when those keys were scored one by one and
// element by element, 0.55-0.63 with the copy row by row (std::copy), 0.78-0.88 by vectors (ctx
// 4096, 3 runs; 0.89-0.92 at 64, which copies nothing); GQA 1 0.47-0.61, 0.63-0.76, 0.82-0.97.
template <int NQ, class D, class Fetch>
HWY_INLINE void ScoreKeys(D d, const uint16_t* kt, size_t tb, size_t n, size_t bt,
                          const float (*qs)[kMaxHeadDim], size_t hd, float (*s)[kTileT], Fetch& fetch) {
  const size_t L = hn::Lanes(d);
  ForEachKeyPass<KeyVectors<NQ, D>()>(
      0, tb, n, GroupedKeys(bt), L,
      [&](size_t t, auto width) {
        ScoreKeyVectors<NQ, decltype(width)::value>(d, kt, tb + t, bt, qs, hd, s, t, fetch);
      },
      [&](size_t t0) {
        // Keys [tb + t0, tb + n) lie in the last group, [hd][w] from its first key; t0 is a
        // multiple of kF16KeyGroup, so the whole group's scores fit the tile's kTileT columns.
        const size_t first = GroupedKeys(bt), w = bt - first;
        const uint16_t* src = kt + detail::f16_sealed_key_index(first, 0, hd, bt);
        HWY_ALIGN uint16_t group[kMaxHeadDim * kF16KeyGroup];
        constexpr size_t kRow = kF16KeyGroup * sizeof(uint16_t);
        CopyRowsZeroPadded(hn::CappedTag<uint8_t, kRow>(), Bytes(src), w * sizeof(uint16_t), w * sizeof(uint16_t),
                           hd, hd * w * sizeof(uint16_t), kRow, reinterpret_cast<uint8_t*>(group));
        NoFetch none;  // the fetch is paced by the whole groups' passes
        for (size_t k = 0; k < kF16KeyGroup; k += L)
          ScoreKeyVectors<NQ, 1>(d, group, k, kF16KeyGroup, qs, hd, s, t0 + k, none);
      });
}

// One query tile's running state over its keys: scaled queries, unnormalised outputs and the
// online softmax's running max and denominator.
template <int NQ>
struct TileState {
  HWY_ALIGN float qs[NQ][kMaxHeadDim];   // scaled queries
  HWY_ALIGN float acc[NQ][kMaxHeadDim];  // unnormalised outputs
  HWY_ALIGN float s[NQ][kTileT];         // scores, then probabilities, of the current key tile
  float m[NQ], l[NQ];
  int max_limit = 0;   // keys [0, max_limit) are visible to some query of the tile
  int min_limit = 0;   // ... and [0, min_limit) to all of them
  size_t head_off = 0;  // bytes from a block's start to the tile's kv head
  // For the next visit's rows. Set once per tile: deriving it from head_bytes inside AttendBlock
  // instead read hd128 GQA 4 5 % slower (1063-1087 against 1135-1144 tokens/s, A/B).
  FetchTo fetch_to = FetchTo::kL1;
  FetchSplit split = kFetchOutsideFold;  // set once per tile, as fetch_to
  bool fine_fetch = false;                // PaceEveryLine()
};

template <int NQ>
void BeginTile(const Tile& tile, int kv_head, size_t head_bytes, KvLayout layout, size_t hd, TileState<NQ>& st) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int j = 0; j < NQ; ++j) {
    for (size_t c = 0; c < hd; ++c) {
      st.qs[j][c] = tile.q[j][c] * scale;
      st.acc[j][c] = 0.0f;
    }
    st.m[j] = -std::numeric_limits<float>::infinity();
    st.l[j] = 0.0f;
    st.max_limit = std::max(st.max_limit, tile.limit[j]);
    st.min_limit = j == 0 ? tile.limit[j] : std::min(st.min_limit, tile.limit[j]);
  }
  st.head_off = static_cast<size_t>(kv_head) * kv_head_stride(layout, head_bytes);
  st.fetch_to = FetchesIntoL2()                  ? FetchTo::kL2
                : FourHeadBlocksFitL1(head_bytes) ? NarrowHeadFetch(NQ)
                                                  : WideHeadFetch(NQ);
  st.split = FetchSplitFor(NQ, head_bytes, st.fetch_to, layout);
  st.fine_fetch = PaceEveryLine();
}

// Streaming softmax over the visible keys of block b, in tiles of kTileT: per tile, score every
// key once for all NQ queries, fold the tile into the running max / denominator, then read each
// value row once. kn, vn: the K and V rows (of this head's size) read next, fetched meanwhile
// (null: none), because the hardware prefetcher stops at page boundaries and at jumps between kv
// heads; with st.split.own_values the tile fetches its own V rows instead of vn.
template <class Rows, int NQ, class D, class Blocks>
HWY_INLINE void AttendBlock(D d, const Tile& tile, const Blocks& kv, size_t head_bytes, size_t b,
                            size_t hd, TileState<NQ>& st, const uint8_t* kn, const uint8_t* vn) {
  const hn::CappedTag<float, kTileT> dt;
  const size_t L = hn::Lanes(d);
  const size_t bt = static_cast<size_t>(kv.block_tokens);
  // Vectors of a value row accumulated per pass: at NQ <= 2, as many as 4 value chunks
  // (kv_format.h) hold, 8 at most (4 vectors of 16 lanes, 8 of 8). A pass reads its chunks side
  // by side, and 8 of them (hd 128 in one pass) read slower from memory than 4: AMD EPYC (Zen 5),
  // one build switching between passes, 16-20 alternating pairs, median ratio of adjacent passes,
  // 4 chunks against 8: hd128 2 threads GQA 1 1.045-1.069x as fast (ctx 4096 batch 16), 1.063x
  // (batch 64), 1.085x (ctx 2048), 1.089x (ctx 8192), 1.077x (ctx 512 batch 64), GQA 2
  // 1.087-1.094x; one thread 1.071x (GQA 1) and 1.089x (GQA 2); KV in L2 0.94x. 2 chunks read
  // 1.044-1.058x, and 0.85x in L2; hd64 with 2 instead of 4, 1.005-1.020x. (Over row-major
  // values, before sealed values were stored in chunks, passes in column halves had read 15-20 %
  // slower.)
  // With AVX-512's 32 registers, 3-4 queries take 4 vectors a pass and 5-8 take 2 (16
  // accumulators), where 2 and 1 had left each weight broadcast feeding fewer multiply-adds. AMD
  // EPYC (Zen 5), one build switching between the two, alternating runs, median GB/s ratios: KV
  // in cache (1 thread, ctx 512, batch 2) GQA 3 1.02x (hd64) and 1.06x (hd128) as fast, GQA 4
  // 1.03x and 1.05x, GQA 8 1.11x and 1.12x; 2 threads from memory (ctx 512/4096, batch 16/64)
  // beside the fast stream (69-73 GB/s) GQA 4 1.03-1.06x, GQA 3 1.03-1.06x, GQA 8 1.07-1.15x,
  // beside the slow stream (44-46) GQA 4 1.01-1.02x; prefill of 2048 tokens (--decode 0)
  // 1.10-1.36x.
  constexpr int kFourChunks = static_cast<int>(4 * kF16ValueChunk / hn::MaxLanes(D()));  // vectors
  constexpr bool kWide = HWY_TARGET <= HWY_AVX3;
  constexpr int CB = NQ <= 2   ? std::min(8, kFourChunks)
                     : NQ <= 4 ? (kWide ? std::min(4, kFourChunks) : 2)
                               : (kWide ? 2 : 1);

  const size_t row_bytes = (head_bytes + bt - 1) / bt;
  const auto* kt = reinterpret_cast<const uint16_t*>(Bytes(kv.k[b]) + st.head_off);
  const uint8_t* vh = Bytes(kv.v[b]) + st.head_off;
  const Rows kr(Bytes(kv.k[b]) + st.head_off, hd, bt), vr(vh, hd, bt);
  const bool sealed = (b + 1) * bt <= static_cast<size_t>(kv.len);  // kv_format.h's sealed layout
  const int block_end = static_cast<int>(std::min((b + 1) * bt, static_cast<size_t>(st.max_limit)));
  for (int t0 = static_cast<int>(b * bt); t0 < block_end;) {
    const size_t tb = static_cast<size_t>(t0) - b * bt;
    const int n = std::min(kTileT, block_end - t0);
    const size_t rows_begin = tb * row_bytes, rows_end = (tb + static_cast<size_t>(n)) * row_bytes;
    // The rows [rows_begin, rows_end) fetched, of the next visit's K and of the next visit's V (or,
    // with split.own_values, this visit's), cut between the tile's phases.
    const FetchSplit& split = st.split;
    const uint8_t* const vf = split.own_values ? vh : vn;  // the V rows fetched
    const size_t k_cut0 = CutTenths(rows_begin, rows_end, split.key_tenths_scoring);
    const size_t k_cut = CutTenths(rows_begin, rows_end, split.key_tenths_scoring + split.key_tenths_folding);
    const size_t v_cut0 = CutTenths(rows_begin, rows_end, split.value_tenths_scoring);
    const size_t v_cut = CutTenths(rows_begin, rows_end, split.value_tenths_scoring + split.value_tenths_folding);
    const size_t scoring_steps =
        sealed ? ScoreKeySteps<NQ>(dt, tb, static_cast<size_t>(n), bt, hd, st.fine_fetch) : TileRowSteps<NQ>(n);
    FetchBoth while_scoring{PacedPrefetch(kn, rows_begin, k_cut0, scoring_steps, st.fetch_to),
                            PacedPrefetch(vf, rows_begin, v_cut0, scoring_steps, st.fetch_to), st.fine_fetch};
    if (sealed) {
      ScoreKeys<NQ>(dt, kt, tb, static_cast<size_t>(n), bt, st.qs, hd, st.s, while_scoring);
    } else {
      ScoreTileRows<NQ>(d, kr, tb, n, st.qs, hd, st.s, while_scoring);
    }
    MaskInvisible<NQ>(st.s, tile.limit, st.min_limit, t0, n);
    // Only the lanes that hold the tile's n keys: a short context or a block's last keys do not
    // pay for the exponentials of a whole tile.
    const size_t LT = hn::Lanes(dt), used = (static_cast<size_t>(n) + LT - 1) / LT * LT;
    FetchBoth while_folding{PacedPrefetch(kn, k_cut0, k_cut, used / LT, st.fetch_to),
                            PacedPrefetch(vf, v_cut0, v_cut, used / LT, st.fetch_to)};
    SoftmaxFoldTiles<NQ>(dt, d, st.s, n, used, st.m, st.l, st.acc, hd, while_folding);
    // Paced every kUnrollRows rows of each pass, or every row (PaceEveryLine), as the keys are.
    // With one slice per pass, up to 32 lines left at once, and the loads stalled behind them. AMD
    // EPYC (Zen 3), 2 threads, ctx 512/4096 x batch 16/64, A/B medians of 5: GQA 1 read 0.88-0.97
    // of the stream bandwidth instead of 0.70-0.91, GQA 4 0.66-0.78 instead of 0.54-0.60 (hd128
    // GQA 4 11.2-11.6 -> 13.5-14.4 GB/s); there a prefetch test before every row, not unrolled, had
    // cost hd128 GQA 4 20 % against every fourth row (see kUnrollRows).
    const size_t value_steps =
        CountPasses<CB, 4>(hd, L) * PacedSteps(static_cast<size_t>(n), kUnrollRows, st.fine_fetch);
    FetchBoth next_values{PacedPrefetch(kn, k_cut, rows_end, value_steps, st.fetch_to),
                          PacedPrefetch(vf, v_cut, rows_end, value_steps, st.fetch_to), st.fine_fetch};
    const auto add_values = [&](const auto& rows) HWY_ATTR {
      ForEachPass<CB, 4>(hd, L, [&](size_t c, auto width) {
        AccumulateRows<NQ, decltype(width)::value>(d, rows, tb, n, st.s, c, st.acc, next_values);
      });
    };
    if (sealed && hd % kF16ValueChunk == 0) {
      add_values(F16ValueChunks<true>(vh, hd, bt));
    } else if (sealed) {
      add_values(F16ValueChunks<false>(vh, hd, bt));
    } else {
      add_values(vr);
    }
    t0 += n;
  }
}

// Attention of a group of tiles that read different kv heads (or, for prefill, different rows),
// block-major (BlockVisits). Each tile's arithmetic is the same as when it runs alone.
template <class Rows, int NQ, class D, class Blocks>
HWY_NOINLINE void AttendGroup(D d, const Tile* tiles, const int* kv_heads, int n_tiles,
                              const Blocks& kv, size_t head_bytes, int head_dim) {
  const size_t hd = static_cast<size_t>(head_dim);
  const size_t bt = static_cast<size_t>(kv.block_tokens);
  TileState<NQ> st[kMaxGroupQ / NQ];
  size_t blocks[kMaxGroupQ / NQ] = {};
  for (int i = 0; i < n_tiles; ++i) {
    BeginTile(tiles[i], kv_heads[i], head_bytes, kv.layout, hd, st[i]);
    blocks[i] = (static_cast<size_t>(st[i].max_limit) + bt - 1) / bt;
  }
  // Visits ahead whose rows are fetched: about FetchAheadBytes() of K and V, one at least.
  const int ahead = visits_ahead(FetchAheadBytes(), head_bytes);
  FetchFirstKeys(blocks, n_tiles, ahead, head_bytes, st[0].fetch_to,
                 [&](int i, size_t b) { return Bytes(kv.k[b]) + st[i].head_off; });
  for (BlockVisits v(blocks, n_tiles, ahead); v.Next();) {
    const int i = v.tile(), ai = v.ahead_tile();
    // Fetched for every tile, also for one query per kv head, which computes so little per
    // byte that its speed is how well the reads are prefetched. On AMD EPYC (Zen 3), 2 threads,
    // ctx 512-4096, batch 16-64, A/B medians of 3: GQA 1 read 0.73-1.03 of the stream bandwidth
    // with it and 0.68-0.78 without (an earlier AMD host had read faster without it on one
    // core). On Intel Xeon (Sapphire Rapids) the L2 streamer stops at every 4 KiB page, and this
    // made hd 64 read 12.5 GB/s on one core instead of 9.9.
    const bool fetch = ai >= 0;
    const uint8_t* kn = fetch ? Bytes(kv.k[v.ahead_block()]) + st[ai].head_off : nullptr;
    const uint8_t* vn = fetch ? Bytes(kv.v[v.ahead_block()]) + st[ai].head_off : nullptr;
    AttendBlock<Rows, NQ>(d, tiles[i], kv, head_bytes, v.block(), hd, st[i], kn, vn);
  }
  for (int i = 0; i < n_tiles; ++i)
    for (int j = 0; j < NQ; ++j) {
      StoreNormalized(d, st[i].acc[j], st[i].l[j], hd, tiles[i].out[j]);
      StoreStats(tiles[i], j, st[i].m[j], st[i].l[j]);
    }
}

template <class Rows, class D, class Blocks>
void RunGroup(D d, const Tile* t, const int* kvh, int n, const Blocks& kv, size_t hb, int head_dim) {
  switch (t[0].n) {
    case 1: return AttendGroup<Rows, 1>(d, t, kvh, n, kv, hb, head_dim);
    case 2: return AttendGroup<Rows, 2>(d, t, kvh, n, kv, hb, head_dim);
    case 3: return AttendGroup<Rows, 3>(d, t, kvh, n, kv, hb, head_dim);
    case 4: return AttendGroup<Rows, 4>(d, t, kvh, n, kv, hb, head_dim);
    case 5: return AttendGroup<Rows, 5>(d, t, kvh, n, kv, hb, head_dim);
    case 6: return AttendGroup<Rows, 6>(d, t, kvh, n, kv, hb, head_dim);
    case 7: return AttendGroup<Rows, 7>(d, t, kvh, n, kv, hb, head_dim);
    default: return AttendGroup<Rows, 8>(d, t, kvh, n, kv, hb, head_dim);
  }
}

// The widest vector (of at most MaxL lanes) whose lane count divides head_dim.
template <class Rows, size_t MaxL, class Blocks>
void RunGroupAnyWidth(const Tile* t, const int* kvh, int n, const Blocks& kv, size_t hb, int head_dim) {
  const hn::CappedTag<float, MaxL> d;
  const size_t hd = static_cast<size_t>(head_dim);
  if (hd % hn::Lanes(d) == 0) return RunGroup<Rows>(d, t, kvh, n, kv, hb, head_dim);
  if (hd % 8 == 0) return RunGroup<Rows>(hn::CappedTag<float, 8>(), t, kvh, n, kv, hb, head_dim);
  if (hd % 4 == 0) return RunGroup<Rows>(hn::CappedTag<float, 4>(), t, kvh, n, kv, hb, head_dim);
  return RunGroup<Rows>(hn::CappedTag<float, 1>(), t, kvh, n, kv, hb, head_dim);
}

// Attention of all query rows and heads that read kv heads [kvh_begin, kvh_end).
template <class Rows, size_t MaxL, class Blocks>
void AttendHeads(const float* q, int n_q, int q_pos0, const Blocks& kv, size_t head_bytes,
                 const AttnDims& dims, int kvh_begin, int kvh_end, float* out, float* stats) {
  for_each_tile_group(q, n_q, q_pos0, dims, kvh_begin, kvh_end, out, stats,
                      [&](const Tile* tiles, const int* kvh, int n) {
                        RunGroupAnyWidth<Rows, MaxL>(tiles, kvh, n, kv, head_bytes, dims.head_dim);
                      });
}

// Vectors of at most 16 lanes (a power of two), so that one lies inside a key group of a sealed
// block and inside a value chunk.
constexpr size_t kMaxLanes = 16;
static_assert(kF16KeyGroup % kMaxLanes == 0 && kF16ValueChunk % kMaxLanes == 0, "vectors must fit a group");

void AttendHeadsF16Impl(const float* q, int n_q, int q_pos0, const KvBlocksF16& kv,
                        const AttnDims& dims, int kvh_begin, int kvh_end, float* out, float* stats) {
  const size_t hb = static_cast<size_t>(kv.block_tokens) * dims.head_dim * sizeof(uint16_t);
  AttendHeads<F16Rows, kMaxLanes>(q, n_q, q_pos0, kv, hb, dims, kvh_begin, kvh_end, out, stats);
}

void AttendHeadsImpl(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                     const AttnDims& dims, int kvh_begin, int kvh_end, float* out, float* stats) {
  switch (kv.dtype) {
    case KvDtype::f16:
      return AttendHeads<F16Rows, kMaxLanes>(q, n_q, q_pos0, kv, head_bytes, dims, kvh_begin, kvh_end, out, stats);
    default:  // q8 and q4 have their own kernels (kernels/attention_quant.cc)
      break;
  }
}

// The exponentials the kernels take, for the tests: ExpNonPositive (kCoarse or not) or ExpWeights.
enum class ExpKind { kFine, kCoarse, kWeights };

template <ExpKind kKind, class D>
HWY_INLINE hn::Vec<D> ExpOfKind(D d, hn::Vec<D> x) {
  if constexpr (kKind == ExpKind::kWeights) {
    return ExpWeights(d, x);
  } else {
    return ExpNonPositive<kKind == ExpKind::kCoarse>(d, x);
  }
}

template <ExpKind kKind>
void SoftmaxExpOf(const float* x, float* y, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  size_t i = 0;
  for (; i + hn::Lanes(d) <= n; i += hn::Lanes(d)) hn::StoreU(ExpOfKind<kKind>(d, hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) hn::StoreU(ExpOfKind<kKind>(d1, hn::LoadU(d1, x + i)), d1, y + i);
}

// The layout the fp16 kernel reads fastest on this CPU (the store's choice, KvFormat::layout):
// KvLayout::kSideBySide on AMD with AVX-512 (SideBySideReadsFaster), where every tile then fetches
// its own values while it scores its keys and the next visit's keys while it sums
// (kFetchOwnValues), so that reads and fetches both walk one run of memory. AMD EPYC (Zen 5),
// fastdecode-bench attention --threads 2 --ctx 512,4096 --batch 16,64 --kv-dtype f16, --kv-layout
// apart and side alternating, 6 runs each, each run-cell by its stream's mode, medians per cell of
// the fraction of the stream read: beside the slow stream (39-49 GB/s) 0.94-1.05 side by side
// against 0.87-0.97 apart (50 of 50 run-cells at 0.90 or more, against 42 of 73), beside the fast
// one (60-80 GB/s) 0.74-0.90 against 0.67-0.80. One thread, from memory (ctx 4096 batch 8, one
// process switching layouts between passes, median of 10 pairs): hd64 GQA 1 1.12x as fast, GQA 4
// 1.04x, hd128 GQA 1 1.09x. Prefill (fastdecode-bench prefill, hd64 and hd128, GQA 1 and 4, 2 runs
// each) 1.00-1.04x. With the splits above (kFetchSpread) the same copies had read 0.81-0.90x as
// fast at GQA 1 and 0.95-1.19x at GQA 4. Off AMD the heads stay apart.
KvLayout F16LayoutImpl() { return SideBySideReadsFaster() ? KvLayout::kSideBySide : KvLayout::kApart; }

void SoftmaxExpImpl(const float* x, float* y, size_t n) { SoftmaxExpOf<ExpKind::kFine>(x, y, n); }
void SoftmaxExpCoarseImpl(const float* x, float* y, size_t n) { SoftmaxExpOf<ExpKind::kCoarse>(x, y, n); }
void SoftmaxWeightExpImpl(const float* x, float* y, size_t n) { SoftmaxExpOf<ExpKind::kWeights>(x, y, n); }

}  // namespace HWY_NAMESPACE
}  // namespace fd::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fd::kernels {

HWY_EXPORT(AttendHeadsF16Impl);
HWY_EXPORT(AttendHeadsImpl);
HWY_EXPORT(F16LayoutImpl);
HWY_EXPORT(SoftmaxExpImpl);
HWY_EXPORT(SoftmaxExpCoarseImpl);
HWY_EXPORT(SoftmaxWeightExpImpl);

namespace {

void check_shape(const AttnDims& d, int block_tokens) {
  if (d.n_kv_heads <= 0 || d.n_heads <= 0 || d.n_heads % d.n_kv_heads != 0 || d.head_dim <= 0 ||
      d.head_dim > kMaxHeadDim || block_tokens <= 0)
    throw std::invalid_argument("Attention cannot run with " + std::to_string(d.n_heads) +
                                " heads, " + std::to_string(d.n_kv_heads) + " kv heads, head_dim " +
                                std::to_string(d.head_dim) + " and blocks of " +
                                std::to_string(block_tokens) + " tokens.");
}

void check_rows(int n_q, int q_pos0, int len) {
  if (n_q < 0 || q_pos0 < 0 || q_pos0 + n_q > len)
    throw std::invalid_argument("Attention query positions [" + std::to_string(q_pos0) + ", " +
                                std::to_string(q_pos0 + n_q) + ") exceed the " +
                                std::to_string(len) + " cached tokens.");
}

// A sequence's keys from key_begin on (a multiple of block_tokens) as a sequence of their own,
// whose len keeps every block's layout (sealed or not, kv_format.h); the row's position bounds
// the keys read.
template <class Blocks>
Blocks key_range(const Blocks& kv, int key_begin) {
  Blocks r = kv;
  const size_t skip = static_cast<size_t>(key_begin / kv.block_tokens);
  r.k = kv.k + skip;
  r.v = kv.v + skip;
  r.len = kv.len - key_begin;
  return r;
}

// Calls fn(kv, q, out, stats, n_q, q_pos0, kvh_begin, kvh_end) for the work units of a batched call
// of n items (attention_units.h) over the pool: rows [q_pos0, q_pos0 + n_q) of the item's kv, whose
// queries and outputs start at q and out; stats null, or (a key-range unit's) [n_heads][2]. The
// key-range units write to scratch, merged into the items' outputs afterwards.
template <class Item, class Fn>
void run_units(const Item* items, size_t n, const AttnDims& d, ThreadPool& pool, const Fn& fn) {
  const std::vector<AttnUnit> units = plan_attention_units(items, n, d.n_kv_heads, pool.threads());
  const size_t row_floats = static_cast<size_t>(d.n_heads) * static_cast<size_t>(d.head_dim);
  const auto key_range_unit = [](const AttnUnit& u) { return u.part >= 0; };
  const size_t parts = static_cast<size_t>(std::count_if(units.begin(), units.end(), key_range_unit));
  std::vector<float> part_out(parts * row_floats), part_stats(parts * static_cast<size_t>(d.n_heads) * 2);
  pool.run(units.size(), [&](size_t u) {
    const AttnUnit& w = units[u];
    const Item& it = items[w.item];
    if (key_range_unit(w)) {  // the item's one row over keys [key_begin, key_end)
      const size_t p = static_cast<size_t>(w.part);
      fn(key_range(it.kv, w.key_begin), it.q, part_out.data() + p * row_floats,
         part_stats.data() + p * static_cast<size_t>(d.n_heads) * 2, 1, w.key_end - w.key_begin - 1,
         w.kvh_begin, w.kvh_end);
      return;
    }
    const size_t skip = static_cast<size_t>(w.row_begin) * row_floats;
    fn(it.kv, it.q + skip, it.out + skip, nullptr, w.row_end - w.row_begin, it.q_pos0 + w.row_begin, w.kvh_begin,
       w.kvh_end);
  });
  if (parts > 0) merge_key_ranges(units, items, d, part_out.data(), part_stats.data());
}

void check_format(const KvFormat& f, int head_dim) {
  if (!f.supports(head_dim))
    throw std::invalid_argument(std::string("The ") + f.name() + " KV format cannot hold head_dim " +
                                std::to_string(head_dim) + ".");
}

}  // namespace

namespace detail {
// Entry used by the KvFormat implementations (kernels/kv_format.cc).
void attend_heads(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                  const AttnDims& d, int kvh_begin, int kvh_end, float* out, float* stats) {
  HWY_DYNAMIC_DISPATCH(AttendHeadsImpl)(q, n_q, q_pos0, kv, head_bytes, d, kvh_begin, kvh_end, out, stats);
}
}  // namespace detail

KvLayout f16_layout() { return HWY_DYNAMIC_DISPATCH(F16LayoutImpl)(); }

void softmax_exp(const float* x, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxExpImpl)(x, y, n); }
void softmax_exp_coarse(const float* x, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxExpCoarseImpl)(x, y, n); }
void softmax_weight_exp(const float* x, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxWeightExpImpl)(x, y, n); }

void attention_f16(const float* q, int n_q, int q_pos0, const KvBlocksF16& kv, const AttnDims& d,
                   float* out) {
  check_shape(d, kv.block_tokens);
  check_rows(n_q, q_pos0, kv.len);
  if (n_q == 0) return;
  HWY_DYNAMIC_DISPATCH(AttendHeadsF16Impl)(q, n_q, q_pos0, kv, d, 0, d.n_kv_heads, out, nullptr);
}

void attention(const float* q, int n_q, int q_pos0, const KvBlocks& kv, const AttnDims& d, float* out) {
  check_shape(d, kv.block_tokens);
  check_rows(n_q, q_pos0, kv.len);
  const KvFormat& f = kv_format(kv.dtype);
  check_format(f, d.head_dim);
  if (n_q == 0) return;
  f.attend(q, n_q, q_pos0, kv, d, 0, d.n_kv_heads, out, nullptr);
}

void attention_batch_f16(const AttnItemF16* items, size_t n, const AttnDims& d, ThreadPool& pool) {
  for (size_t i = 0; i < n; ++i) {
    check_shape(d, items[i].kv.block_tokens);
    check_rows(items[i].n_q, items[i].q_pos0, items[i].kv.len);
  }
  const auto attend = HWY_DYNAMIC_DISPATCH(AttendHeadsF16Impl);
  run_units(items, n, d, pool, [&](const KvBlocksF16& kv, const float* q, float* out, float* stats, int n_q, int q_pos0,
                                   int kvh_begin, int kvh_end) {
    attend(q, n_q, q_pos0, kv, d, kvh_begin, kvh_end, out, stats);
  });
}

void attention_batch(const AttnItem* items, size_t n, const AttnDims& d, ThreadPool& pool) {
  for (size_t i = 0; i < n; ++i) {
    check_shape(d, items[i].kv.block_tokens);
    check_rows(items[i].n_q, items[i].q_pos0, items[i].kv.len);
    check_format(kv_format(items[i].kv.dtype), d.head_dim);
  }
  run_units(items, n, d, pool, [&](const KvBlocks& kv, const float* q, float* out, float* stats, int n_q, int q_pos0,
                                   int kvh_begin, int kvh_end) {
    kv_format(kv.dtype).attend(q, n_q, q_pos0, kv, d, kvh_begin, kvh_end, out, stats);
  });
}

}  // namespace fd::kernels
#endif  // HWY_ONCE
