#include "kernels/attention_units.h"

#include <algorithm>

namespace fd::kernels {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Keys seen by rows [0, r) of an item whose row 0 sits at pos0 (row i sees pos0 + i + 1).
uint64_t keys_before(uint64_t pos0, uint64_t r) { return r * (pos0 + 1) + (r > 0 ? r * (r - 1) / 2 : 0); }

// The first row of each of `parts` ranges of rows [0, n) of about equal cost, at multiples of
// kUnitRowAlign (fewer ranges when the rows are too few), then n.
std::vector<int> row_cuts(uint64_t pos0, int n, uint64_t parts) {
  std::vector<int> cuts{0};
  const uint64_t all = keys_before(pos0, uint64_t(n)), steps = ceil_div(uint64_t(n), kUnitRowAlign);
  for (uint64_t k = 1; k < parts; ++k) {
    // The first multiple of kUnitRowAlign whose rows before it see k/parts of the keys.
    const uint64_t want = all * k / parts;
    uint64_t lo = uint64_t(cuts.back()) / kUnitRowAlign + 1, hi = steps;
    while (lo < hi) {
      const uint64_t mid = (lo + hi) / 2;
      if (keys_before(pos0, mid * kUnitRowAlign) >= want)
        hi = mid;
      else
        lo = mid + 1;
    }
    if (lo * kUnitRowAlign >= uint64_t(n)) break;
    cuts.push_back(static_cast<int>(lo * kUnitRowAlign));
  }
  cuts.push_back(n);
  return cuts;
}

template <class Item>
std::vector<AttnUnit> plan(const Item* items, size_t n, int kv_heads, int threads) {
  std::vector<AttnUnit> units;
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i)
    if (items[i].n_q > 0) total += keys_before(uint64_t(items[i].q_pos0), uint64_t(items[i].n_q));
  total *= uint64_t(kv_heads);
  const uint64_t limit = std::max<uint64_t>(1, ceil_div(total, 4 * uint64_t(std::max(threads, 1))));
  for (size_t i = 0; i < n; ++i) {
    const Item& it = items[i];
    if (it.n_q <= 0) continue;
    const uint64_t pos0 = uint64_t(it.q_pos0), per_head = keys_before(pos0, uint64_t(it.n_q));
    if (threads <= 1) {
      units.push_back({i, 0, kv_heads, 0, it.n_q, per_head * uint64_t(kv_heads)});
      continue;
    }
    const uint64_t head_parts = std::min<uint64_t>(uint64_t(kv_heads), ceil_div(per_head * uint64_t(kv_heads), limit));
    const int hpu = static_cast<int>(ceil_div(uint64_t(kv_heads), head_parts));
    const std::vector<int> cuts = row_cuts(pos0, it.n_q, ceil_div(per_head * uint64_t(hpu), limit));
    for (int h = 0; h < kv_heads; h += hpu) {
      const int h_end = std::min(h + hpu, kv_heads);
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        const uint64_t keys = keys_before(pos0, uint64_t(cuts[c + 1])) - keys_before(pos0, uint64_t(cuts[c]));
        units.push_back({i, h, h_end, cuts[c], cuts[c + 1], keys * uint64_t(h_end - h)});
      }
    }
  }
  std::stable_sort(units.begin(), units.end(), [](const AttnUnit& a, const AttnUnit& b) { return a.cost > b.cost; });
  return units;
}

}  // namespace

std::vector<AttnUnit> plan_attention_units(const AttnItem* items, size_t n, int kv_heads, int threads) {
  return plan(items, n, kv_heads, threads);
}
std::vector<AttnUnit> plan_attention_units(const AttnItemF16* items, size_t n, int kv_heads, int threads) {
  return plan(items, n, kv_heads, threads);
}

}  // namespace fd::kernels
