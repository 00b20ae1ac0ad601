#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/attention_tile.h"
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

constexpr int kTileT = 16;        // keys scored per softmax step
constexpr int kMaxHeadDim = 256;

}  // namespace
}  // namespace fd::kernels
#endif  // FD_KERNELS_ATTENTION_TILE_

HWY_BEFORE_NAMESPACE();
namespace fd::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Row readers: Load(d, t, c) returns elements [c, c + Lanes(d)) of row t of one kv head's block
// as fp32. Layouts are documented in kernels/kv_format.h.
struct F16Rows {
  const uint16_t* x;  // [block_tokens][head_dim]
  size_t hd;
  F16Rows(const uint8_t* head_block, size_t head_dim, size_t)
      : x(reinterpret_cast<const uint16_t*>(head_block)), hd(head_dim) {}
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D d, size_t t, size_t c) const {
    return LoadF16(d, x + t * hd + c);
  }
};

// out[j] = sum of the lanes of a[j]. Four vectors at a time are transposed-and-added within
// each 128-bit block, then the blocks are folded: about a third of the work of four reductions.
template <int NQ, class D>
HWY_INLINE void LaneSums(D d, const hn::Vec<D>* a, float* out) {
  int j = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (NQ >= 4 && hn::MaxLanes(D()) >= 4) {
    for (; j + 4 <= NQ; j += 4) {
      const auto sums = FoldBlocks(d, Sum4InBlocks(d, a[j], a[j + 1], a[j + 2], a[j + 3]));
      hn::StoreU(sums, hn::DFromV<decltype(sums)>(), out + j);
    }
  }
#endif
  for (; j < NQ; ++j) out[j] = hn::GetLane(hn::SumOfLanes(d, a[j]));
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
  LaneSums<TP * NQ>(d, a, sums);
}

// Streaming softmax over the keys in tiles of kTileT: per tile, score every key once for all NQ
// queries, fold the tile into the running max / denominator, then read each value row once.
template <class Rows, int NQ, class D, class Blocks>
HWY_NOINLINE void AttendTile(D d, const Tile& tile, const Blocks& kv, size_t head_bytes,
                             int kv_head, int head_dim) {
  using V = hn::Vec<D>;
  const hn::CappedTag<float, kTileT> dt;
  const size_t L = hn::Lanes(d);
  const size_t hd = static_cast<size_t>(head_dim);
  const size_t bt = static_cast<size_t>(kv.block_tokens);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const float neg_inf = -std::numeric_limits<float>::infinity();

  constexpr int TP = NQ == 1 ? 4 : NQ == 2 ? 2 : 1;  // key rows scored per pass
  constexpr int CB = NQ <= 2 ? 4 : NQ <= 4 ? 2 : 1;  // value chunks accumulated per pass
  HWY_ALIGN float qs[NQ][kMaxHeadDim];   // scaled queries
  HWY_ALIGN float acc[NQ][kMaxHeadDim];  // unnormalised outputs
  HWY_ALIGN float s[NQ][kTileT];         // scores, then probabilities, of the current tile
  float m[NQ], l[NQ];
  int max_limit = 0;
  for (int j = 0; j < NQ; ++j) {
    for (size_t c = 0; c < hd; ++c) {
      qs[j][c] = tile.q[j][c] * scale;
      acc[j][c] = 0.0f;
    }
    m[j] = neg_inf;
    l[j] = 0.0f;
    max_limit = std::max(max_limit, tile.limit[j]);
  }

  const size_t head_off = static_cast<size_t>(kv_head) * head_bytes;
  const size_t n_blocks = (static_cast<size_t>(max_limit) + bt - 1) / bt;
  const size_t row_bytes = (head_bytes + bt - 1) / bt;  // prefetch pace: one row's share per key
  for (int t0 = 0; t0 < max_limit;) {
    const size_t b = static_cast<size_t>(t0) / bt;
    const size_t tb = static_cast<size_t>(t0) - b * bt;
    const int n = static_cast<int>(
        std::min<size_t>({static_cast<size_t>(kTileT), bt - tb, static_cast<size_t>(max_limit - t0)}));
    const uint8_t* kb = Bytes(kv.k[b]) + head_off;
    const uint8_t* vb = Bytes(kv.v[b]) + head_off;
    // The next block sits on another page, out of reach of the hardware prefetcher: fetch it
    // while this one is computed, a slice per key so the requests do not arrive in one burst.
    const uint8_t* kn = b + 1 < n_blocks ? Bytes(kv.k[b + 1]) + head_off : nullptr;
    const uint8_t* vn = b + 1 < n_blocks ? Bytes(kv.v[b + 1]) + head_off : nullptr;
    const Rows kr(kb, hd, bt), vr(vb, hd, bt);
    size_t pf = tb * row_bytes / 64 * 64;  // next prefetch offset in the next block

    for (int t = 0; t < n;) {
      if (kn != nullptr) {
        for (const size_t end = (tb + static_cast<size_t>(t) + TP) * row_bytes; pf < end; pf += 64) {
          hwy::Prefetch(kn + pf);
          hwy::Prefetch(vn + pf);
        }
      }
      float sums[TP * NQ];
      const int rows = t + TP <= n ? TP : 1;  // the last rows of a block go one at a time
      if (rows == TP)
        ScoreRows<NQ, TP>(d, kr, tb + static_cast<size_t>(t), qs, hd, sums);
      else
        ScoreRows<NQ, 1>(d, kr, tb + static_cast<size_t>(t), qs, hd, sums);
      for (int p = 0; p < rows; ++p) {
        const int tt = t + p;
#pragma GCC unroll 8
        for (int j = 0; j < NQ; ++j) s[j][tt] = t0 + tt < tile.limit[j] ? sums[p * NQ + j] : neg_inf;
      }
      t += rows;
    }
    for (int j = 0; j < NQ; ++j) SoftmaxFoldTile(dt, d, s[j], n, kTileT, m[j], l[j], acc[j], hd);
    size_t c = 0;
    for (; c + CB * L <= hd; c += CB * L) AccumulateRows<NQ, CB>(d, vr, tb, n, s, c, acc);
    for (; c < hd; c += L) AccumulateRows<NQ, 1>(d, vr, tb, n, s, c, acc);
    t0 += n;
  }

  for (int j = 0; j < NQ; ++j) {
    const V inv = hn::Set(d, 1.0f / l[j]);
    for (size_t c = 0; c < hd; c += L) hn::StoreU(hn::Mul(hn::Load(d, acc[j] + c), inv), d, tile.out[j] + c);
  }
}

template <class Rows, class D, class Blocks>
void RunTile(D d, const Tile& tile, const Blocks& kv, size_t hb, int kv_head, int head_dim) {
  switch (tile.n) {
    case 1: return AttendTile<Rows, 1>(d, tile, kv, hb, kv_head, head_dim);
    case 2: return AttendTile<Rows, 2>(d, tile, kv, hb, kv_head, head_dim);
    case 3: return AttendTile<Rows, 3>(d, tile, kv, hb, kv_head, head_dim);
    case 4: return AttendTile<Rows, 4>(d, tile, kv, hb, kv_head, head_dim);
    case 5: return AttendTile<Rows, 5>(d, tile, kv, hb, kv_head, head_dim);
    case 6: return AttendTile<Rows, 6>(d, tile, kv, hb, kv_head, head_dim);
    case 7: return AttendTile<Rows, 7>(d, tile, kv, hb, kv_head, head_dim);
    default: return AttendTile<Rows, 8>(d, tile, kv, hb, kv_head, head_dim);
  }
}

// The widest vector (of at most MaxL lanes) whose lane count divides head_dim.
template <class Rows, size_t MaxL, class Blocks>
void RunTileAnyWidth(const Tile& tile, const Blocks& kv, size_t hb, int kv_head, int head_dim) {
  const hn::CappedTag<float, MaxL> d;
  const size_t hd = static_cast<size_t>(head_dim);
  if (hd % hn::Lanes(d) == 0) return RunTile<Rows>(d, tile, kv, hb, kv_head, head_dim);
  if (hd % 8 == 0) return RunTile<Rows>(hn::CappedTag<float, 8>(), tile, kv, hb, kv_head, head_dim);
  if (hd % 4 == 0) return RunTile<Rows>(hn::CappedTag<float, 4>(), tile, kv, hb, kv_head, head_dim);
  return RunTile<Rows>(hn::CappedTag<float, 1>(), tile, kv, hb, kv_head, head_dim);
}

// Attention of all query rows and heads that read kv heads [kvh_begin, kvh_end).
template <class Rows, size_t MaxL, class Blocks>
void AttendHeads(const float* q, int n_q, int q_pos0, const Blocks& kv, size_t head_bytes,
                 const AttnDims& dims, int kvh_begin, int kvh_end, float* out) {
  for_each_tile(q, n_q, q_pos0, dims, kvh_begin, kvh_end, out, [&](const Tile& tile, int kvh) {
    RunTileAnyWidth<Rows, MaxL>(tile, kv, head_bytes, kvh, dims.head_dim);
  });
}

constexpr size_t kAnyLanes = size_t(1) << 20;  // no cap on the vector width

void AttendHeadsF16Impl(const float* q, int n_q, int q_pos0, const KvBlocksF16& kv,
                        const AttnDims& dims, int kvh_begin, int kvh_end, float* out) {
  const size_t hb = static_cast<size_t>(kv.block_tokens) * dims.head_dim * sizeof(uint16_t);
  AttendHeads<F16Rows, kAnyLanes>(q, n_q, q_pos0, kv, hb, dims, kvh_begin, kvh_end, out);
}

void AttendHeadsImpl(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                     const AttnDims& dims, int kvh_begin, int kvh_end, float* out) {
  switch (kv.dtype) {
    case KvDtype::f16:
      return AttendHeads<F16Rows, kAnyLanes>(q, n_q, q_pos0, kv, head_bytes, dims, kvh_begin, kvh_end, out);
    default:  // q8 and q4 have their own kernels (kernels/attention_quant.cc)
      break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace fd::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fd::kernels {

HWY_EXPORT(AttendHeadsF16Impl);
HWY_EXPORT(AttendHeadsImpl);

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

void check_format(const KvFormat& f, int head_dim) {
  if (!f.supports(head_dim))
    throw std::invalid_argument(std::string("The ") + f.name() + " KV format cannot hold head_dim " +
                                std::to_string(head_dim) + ".");
}

}  // namespace

namespace detail {
// Entry used by the KvFormat implementations (kernels/kv_format.cc).
void attend_heads(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                  const AttnDims& d, int kvh_begin, int kvh_end, float* out) {
  HWY_DYNAMIC_DISPATCH(AttendHeadsImpl)(q, n_q, q_pos0, kv, head_bytes, d, kvh_begin, kvh_end, out);
}
}  // namespace detail

void attention_f16(const float* q, int n_q, int q_pos0, const KvBlocksF16& kv, const AttnDims& d,
                   float* out) {
  check_shape(d, kv.block_tokens);
  check_rows(n_q, q_pos0, kv.len);
  if (n_q == 0) return;
  HWY_DYNAMIC_DISPATCH(AttendHeadsF16Impl)(q, n_q, q_pos0, kv, d, 0, d.n_kv_heads, out);
}

void attention(const float* q, int n_q, int q_pos0, const KvBlocks& kv, const AttnDims& d, float* out) {
  check_shape(d, kv.block_tokens);
  check_rows(n_q, q_pos0, kv.len);
  const KvFormat& f = kv_format(kv.dtype);
  check_format(f, d.head_dim);
  if (n_q == 0) return;
  f.attend(q, n_q, q_pos0, kv, d, 0, d.n_kv_heads, out);
}

void attention_batch_f16(const AttnItemF16* items, size_t n, const AttnDims& d, ThreadPool& pool) {
  for (size_t i = 0; i < n; ++i) {
    check_shape(d, items[i].kv.block_tokens);
    check_rows(items[i].n_q, items[i].q_pos0, items[i].kv.len);
  }
  const size_t h = static_cast<size_t>(d.n_kv_heads);
  const auto fn = HWY_DYNAMIC_DISPATCH(AttendHeadsF16Impl);
  pool.run(n * h, [&](size_t u) {
    const AttnItemF16& it = items[u / h];
    const int kvh = static_cast<int>(u % h);
    if (it.n_q > 0) fn(it.q, it.n_q, it.q_pos0, it.kv, d, kvh, kvh + 1, it.out);
  });
}

void attention_batch(const AttnItem* items, size_t n, const AttnDims& d, ThreadPool& pool) {
  for (size_t i = 0; i < n; ++i) {
    check_shape(d, items[i].kv.block_tokens);
    check_rows(items[i].n_q, items[i].q_pos0, items[i].kv.len);
    check_format(kv_format(items[i].kv.dtype), d.head_dim);
  }
  const size_t h = static_cast<size_t>(d.n_kv_heads);
  pool.run(n * h, [&](size_t u) {
    const AttnItem& it = items[u / h];
    const int kvh = static_cast<int>(u % h);
    if (it.n_q > 0) kv_format(it.kv.dtype).attend(it.q, it.n_q, it.q_pos0, it.kv, d, kvh, kvh + 1, it.out);
  });
}

}  // namespace fd::kernels
#endif  // HWY_ONCE
