// Query tiles of the attention kernels (kernels/attention.cc, kernels/attention_quant.cc): the
// query vectors that read one kv head's keys together, in one pass.
#pragma once
#include <algorithm>
#include <cstddef>

#include "kernels/attention.h"

namespace fd::kernels {

constexpr int kMaxQ = 8;        // query vectors that share one pass over a kv head
// Query vectors of the tiles that share one pass over the blocks. 32 holds GQA 4's 8 kv heads, so
// that a pass reads each page's K (and V) as one run rather than halves of it: AMD EPYC (Zen 5),
// 2 threads, ctx 4096, batch 64, GQA 4, 2 alternating runs against 16, GB/s: fp16 hd64 39.0 ->
// 42.4, hd128 35.8 -> 41.2, int8 hd64 27.8 -> 29.8, hd128 28.5 -> 29.5, int4 20.3 -> 20.9,
// 21.8 -> 23.8.
constexpr int kMaxGroupQ = 32;

// The query heads of a GQA group and, for prefill, several rows. Keys [0, limit[j]) are visible
// to query j.
struct Tile {
  const float* q[kMaxQ];  // each [head_dim]
  float* out[kMaxQ];      // each [head_dim]
  float* stats[kMaxQ];    // each [2]: the softmax's max and denominator; null: not wanted
  int limit[kMaxQ];
  int n = 0;
};

// Where query j's softmax statistics go: {m, l} of out = sum_t exp(s_t - m) v_t / l, with
// l = sum_t exp(s_t - m), s_t its scaled scores (attention_batch merges key ranges with them).
inline void StoreStats(const Tile& tile, int j, float m, float l) {
  if (float* st = tile.stats[j]) {
    st[0] = m;
    st[1] = l;
  }
}

// Calls run(tile, kv_head) for every kv head in [kvh_begin, kvh_end) with the query vectors that
// read it, at most kMaxQ at a time. q, out: [n_q][n_heads][head_dim]; row i sits at q_pos0 + i.
// stats: null, or [n_q][n_heads][2] for the softmax statistics (StoreStats).
template <class Run>
void for_each_tile(const float* q, int n_q, int q_pos0, const AttnDims& dims, int kvh_begin,
                   int kvh_end, float* out, float* stats, const Run& run) {
  const int g = dims.n_heads / dims.n_kv_heads;
  const size_t hd = static_cast<size_t>(dims.head_dim);
  for (int kvh = kvh_begin; kvh < kvh_end; ++kvh) {
    Tile tile;
    for (int i = 0; i < n_q; ++i) {
      for (int jj = 0; jj < g; ++jj) {
        const size_t off = (static_cast<size_t>(i) * dims.n_heads + kvh * g + jj) * hd;
        tile.q[tile.n] = q + off;
        tile.out[tile.n] = out + off;
        tile.stats[tile.n] = stats == nullptr ? nullptr : stats + off / hd * 2;
        tile.limit[tile.n] = q_pos0 + i + 1;
        if (++tile.n == kMaxQ) {
          run(tile, kvh);
          tile.n = 0;
        }
      }
    }
    if (tile.n > 0) run(tile, kvh);
  }
}

// Calls run(tiles, kv_heads, n) for the tiles of for_each_tile in order, grouped: consecutive
// tiles with the same number of query vectors, at most kMaxGroupQ vectors per group.
template <class Run>
void for_each_tile_group(const float* q, int n_q, int q_pos0, const AttnDims& dims, int kvh_begin,
                         int kvh_end, float* out, float* stats, const Run& run) {
  Tile tiles[kMaxGroupQ];
  int heads[kMaxGroupQ];
  int n = 0;
  for_each_tile(q, n_q, q_pos0, dims, kvh_begin, kvh_end, out, stats, [&](const Tile& tile, int kvh) {
    if (n > 0 && (tiles[0].n != tile.n || (n + 1) * tile.n > kMaxGroupQ)) {
      run(tiles, heads, n);
      n = 0;
    }
    tiles[n] = tile;
    heads[n++] = kvh;
  });
  if (n > 0) run(tiles, heads, n);
}

// Visits of BlockVisits to fetch ahead so that about ahead_bytes of K and V are in flight, for kv
// head blocks of head_bytes each (at least one).
inline int visits_ahead(size_t ahead_bytes, size_t head_bytes) {
  return static_cast<int>(std::max<size_t>(1, ahead_bytes / (2 * head_bytes)));
}

// The block-major order in which a group of tiles reads its blocks: for each block, every tile
// whose keys reach it (tile i reads blocks [0, blocks[i])). A block holds the K (and the V) of all
// kv heads side by side, so this order reads them as one run of memory. Each Next() moves to the
// next visit, tile() reading block(), and names the visit `lookahead` steps later, the rows to
// prefetch: ahead_tile() reading ahead_block() (ahead_tile() < 0 when there is none).
// A cursor rather than a function taking the visit's body, so that the kernels' loops hold the
// body inline: a body passed to a function of this header (which has no AVX target) was compiled
// as a call per visit, whose setup took about a tenth of the samples in int4 hd64 GQA 4's visit.
// AMD EPYC (Zen 4), one thread, KV in L2 (--ctx 512 --batch 1 --cold-size 0), best of 4-5
// alternating runs against that, GB/s: int8 hd64 GQA 1 33.9 -> 45.4, GQA 4 27.1 -> 28.3, hd128
// 54.6 -> 57.0 and 33.5 -> 34.3; int4 hd64 27.4 -> 28.7 and 14.3 -> 14.6, hd128 33.7 -> 35.5 and
// 17.1 -> 17.4; fp16 hd64 41.8 -> 43.4 and 21.2 -> 21.6, hd128 46.8 -> 47.5 and 23.1 -> 23.4.
class BlockVisits {
 public:
  BlockVisits(const size_t* blocks, int n, int lookahead) : blocks_(blocks), n_(n) {
    for (int i = 0; i < n; ++i) max_blocks_ = blocks[i] > max_blocks_ ? blocks[i] : max_blocks_;
    ahead_ = max_blocks_ > 0 && Step(ai_, ab_);  // the first visit, where the cursor is after Next()
    for (int d = 0; d < lookahead && ahead_; ++d) ahead_ = Step(ai_, ab_);
  }
  bool Next() {
    if (i_ >= 0 && ahead_) ahead_ = Step(ai_, ab_);
    return max_blocks_ > 0 && Step(i_, b_);
  }
  int tile() const { return i_; }
  size_t block() const { return b_; }
  int ahead_tile() const { return ahead_ ? ai_ : -1; }
  size_t ahead_block() const { return ab_; }

 private:
  // Moves (i, b) to the next visit; false when there is none.
  bool Step(int& i, size_t& b) const {
    for (;;) {
      if (++i == n_) {
        i = 0;
        if (++b >= max_blocks_) return false;
      }
      if (b < blocks_[i]) return true;
    }
  }
  const size_t* blocks_;
  int n_;
  size_t max_blocks_ = 0;
  int i_ = -1, ai_ = -1;
  size_t b_ = 0, ab_ = 0;
  bool ahead_ = false;
};

}  // namespace fd::kernels
