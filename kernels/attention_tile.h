// Query tiles of the attention kernels (kernels/attention.cc, kernels/attention_quant.cc): the
// query vectors that read one kv head's keys together, in one pass.
#pragma once
#include <cstddef>

#include "kernels/attention.h"

namespace fd::kernels {

constexpr int kMaxQ = 8;  // query vectors that share one pass over a kv head

// The query heads of a GQA group and, for prefill, several rows. Keys [0, limit[j]) are visible
// to query j.
struct Tile {
  const float* q[kMaxQ];  // each [head_dim]
  float* out[kMaxQ];      // each [head_dim]
  int limit[kMaxQ];
  int n = 0;
};

// Calls run(tile, kv_head) for every kv head in [kvh_begin, kvh_end) with the query vectors that
// read it, at most kMaxQ at a time. q, out: [n_q][n_heads][head_dim]; row i sits at q_pos0 + i.
template <class Run>
void for_each_tile(const float* q, int n_q, int q_pos0, const AttnDims& dims, int kvh_begin,
                   int kvh_end, float* out, const Run& run) {
  const int g = dims.n_heads / dims.n_kv_heads;
  const size_t hd = static_cast<size_t>(dims.head_dim);
  for (int kvh = kvh_begin; kvh < kvh_end; ++kvh) {
    Tile tile;
    for (int i = 0; i < n_q; ++i) {
      for (int jj = 0; jj < g; ++jj) {
        const size_t off = (static_cast<size_t>(i) * dims.n_heads + kvh * g + jj) * hd;
        tile.q[tile.n] = q + off;
        tile.out[tile.n] = out + off;
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

}  // namespace fd::kernels
