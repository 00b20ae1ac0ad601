// How a batched attention call (attention_batch) is cut into work units for a thread pool.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_tile.h"

namespace fd::kernels {

// Query rows [row_begin, row_end) of one item, over kv heads [kvh_begin, kvh_end); when key_end
// > 0, only the keys [key_begin, key_end) of its one row (a key range, see below).
struct AttnUnit {
  size_t item = 0;
  int kvh_begin = 0, kvh_end = 0;
  int row_begin = 0, row_end = 0;
  uint64_t cost = 0;  // keys the unit's rows see, summed over its rows and kv heads
  int key_begin = 0, key_end = 0;
  int part = -1;  // a key-range unit's slot in the call's scratch: 0, 1, ... in plan order; else -1
};

// Rows of a prefill are cut only at multiples of this: a tile holds kMaxQ consecutive query
// vectors of a kv head, g per row, so a cut after a multiple of kMaxQ rows (g * kMaxQ vectors)
// leaves every tile as it is without the cut, and a row's output does not depend on the cut.
constexpr int kUnitRowAlign = kMaxQ;

// The fewest keys a key range (below) is cut to: a thread woken for less costs more than it saves.
constexpr uint64_t kMinKeyRange = 1024;

// The units of a call, costliest first (the pool hands them out in order). A unit costs at most
// about 1/(4 * threads) of the call, when it can be cut that fine: an item costlier than that is
// cut into ranges of kv heads first (a unit then still reads each block's K and V of its heads as
// one run of memory) and, when one kv head of it is still too costly (a prefill), into ranges of
// its rows of about equal cost. So a long prompt's prefill, even beside many decode rows, or over
// fewer kv heads than threads, keeps every thread busy. Items with no rows get no unit.
// When that still leaves fewer units than threads (a few decoding sequences over few kv heads),
// the keys of each single-row item's kv heads are cut into ranges of whole blocks, one kv head per
// unit, of about 1/threads of the call's keys and kMinKeyRange keys at least: each range's output
// and softmax statistics are merged afterwards (merge_key_ranges), which rounds differently from
// one pass, so this is done only when threads would otherwise idle.
std::vector<AttnUnit> plan_attention_units(const AttnItem* items, size_t n, int kv_heads, int threads);
std::vector<AttnUnit> plan_attention_units(const AttnItemF16* items, size_t n, int kv_heads, int threads);

// The outputs of the key-range units (part >= 0) of a plan, merged into their items' outputs:
// part_out [parts][n_heads][head_dim] and part_stats [parts][n_heads][2] hold, for the key-range
// unit of part p, its row's outputs and softmax statistics (max m, denominator l)
// for the query heads of its kv head; each query head's output becomes
// sum_p l_p exp(m_p - M) out_p / sum_p l_p exp(m_p - M), M the largest m_p.
template <class Item>
void merge_key_ranges(const std::vector<AttnUnit>& units, const Item* items, const AttnDims& d,
                      const float* part_out, const float* part_stats);

}  // namespace fd::kernels
