// How a batched attention call (attention_batch) is cut into work units for a thread pool.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_tile.h"

namespace fd::kernels {

// Query rows [row_begin, row_end) of one item, over kv heads [kvh_begin, kvh_end).
struct AttnUnit {
  size_t item = 0;
  int kvh_begin = 0, kvh_end = 0;
  int row_begin = 0, row_end = 0;
  uint64_t cost = 0;  // keys the unit's rows see, summed over its rows and kv heads
};

// Rows of a prefill are cut only at multiples of this: a tile holds kMaxQ consecutive query
// vectors of a kv head, g per row, so a cut after a multiple of kMaxQ rows (g * kMaxQ vectors)
// leaves every tile as it is without the cut, and a row's output does not depend on the cut.
constexpr int kUnitRowAlign = kMaxQ;

// The units of a call, costliest first (the pool hands them out in order). A unit costs at most
// about 1/(4 * threads) of the call, when it can be cut that fine: an item costlier than that is
// cut into ranges of kv heads first (a unit then still reads each block's K and V of its heads as
// one run of memory) and, when one kv head of it is still too costly (a prefill), into ranges of
// its rows of about equal cost. So a long prompt's prefill, even beside many decode rows, or over
// fewer kv heads than threads, keeps every thread busy. Items with no rows get no unit.
std::vector<AttnUnit> plan_attention_units(const AttnItem* items, size_t n, int kv_heads, int threads);
std::vector<AttnUnit> plan_attention_units(const AttnItemF16* items, size_t n, int kv_heads, int threads);

}  // namespace fd::kernels
