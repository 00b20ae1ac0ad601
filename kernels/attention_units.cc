#include "kernels/attention_units.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

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

// The units with each single-row unit's kv heads cut into key ranges of whole blocks of about
// `limit` keys each (one kv head per unit; a head too short to cut keeps one unit).
template <class Item>
std::vector<AttnUnit> cut_key_ranges(const Item* items, const std::vector<AttnUnit>& units, uint64_t limit) {
  std::vector<AttnUnit> out;
  for (const AttnUnit& u : units) {
    const Item& it = items[u.item];
    if (it.n_q != 1) {
      out.push_back(u);
      continue;
    }
    const uint64_t keys = uint64_t(it.q_pos0) + 1, bt = uint64_t(std::max(it.kv.block_tokens, 1));
    const uint64_t blocks = ceil_div(keys, bt), parts = std::min(blocks, ceil_div(keys, limit));
    for (int h = u.kvh_begin; h < u.kvh_end; ++h) {
      if (parts <= 1) {
        out.push_back({u.item, h, h + 1, 0, 1, keys});
        continue;
      }
      for (uint64_t p = 0; p < parts; ++p) {
        const uint64_t k0 = blocks * p / parts * bt, k1 = std::min(keys, blocks * (p + 1) / parts * bt);
        out.push_back({u.item, h, h + 1, 0, 1, k1 - k0, int(k0), int(k1)});
      }
    }
  }
  return out;
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
  if (threads > 1 && units.size() < size_t(threads))
    units = cut_key_ranges(items, units, std::max<uint64_t>(ceil_div(total, uint64_t(threads)), kMinKeyRange));
  std::stable_sort(units.begin(), units.end(), [](const AttnUnit& a, const AttnUnit& b) { return a.cost > b.cost; });
  int parts = 0;
  for (AttnUnit& u : units)
    if (u.key_end > 0) u.part = parts++;
  return units;
}

}  // namespace

std::vector<AttnUnit> plan_attention_units(const AttnItem* items, size_t n, int kv_heads, int threads) {
  return plan(items, n, kv_heads, threads);
}
std::vector<AttnUnit> plan_attention_units(const AttnItemF16* items, size_t n, int kv_heads, int threads) {
  return plan(items, n, kv_heads, threads);
}

template <class Item>
void merge_key_ranges(const std::vector<AttnUnit>& units, const Item* items, const AttnDims& d,
                      const float* part_out, const float* part_stats) {
  const size_t hd = size_t(d.head_dim), heads = size_t(d.n_heads), g = heads / size_t(d.n_kv_heads);
  // The key-range units' parts, grouped by item and kv head.
  std::vector<std::pair<std::pair<size_t, int>, size_t>> parts;
  for (const AttnUnit& u : units)
    if (u.part >= 0) parts.push_back({{u.item, u.kvh_begin}, size_t(u.part)});
  std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<float> w;  // the parts' weights l_p exp(m_p - M)
  for (size_t first = 0; first < parts.size();) {
    size_t last = first;
    while (last < parts.size() && parts[last].first == parts[first].first) ++last;
    const auto [item, kvh] = parts[first].first;
    for (size_t h = size_t(kvh) * g; h < size_t(kvh + 1) * g; ++h) {
      float m = -std::numeric_limits<float>::infinity();
      for (size_t i = first; i < last; ++i) m = std::max(m, part_stats[(parts[i].second * heads + h) * 2]);
      // A NaN statistic (a NaN query or cached row) makes its weight, and so the output, NaN.
      float sum = 0.0f;
      w.resize(last - first);
      for (size_t i = first; i < last; ++i) {
        const float* st = part_stats + (parts[i].second * heads + h) * 2;
        w[i - first] = st[1] * std::exp(st[0] - m);
        sum += w[i - first];
      }
      float* out = items[item].out + h * hd;
      for (size_t c = 0; c < hd; ++c) {
        float acc = 0.0f;
        for (size_t i = first; i < last; ++i) acc += w[i - first] * part_out[(parts[i].second * heads + h) * hd + c];
        out[c] = acc / sum;
      }
    }
    first = last;
  }
}
template void merge_key_ranges(const std::vector<AttnUnit>&, const AttnItem*, const AttnDims&, const float*,
                               const float*);
template void merge_key_ranges(const std::vector<AttnUnit>&, const AttnItemF16*, const AttnDims&, const float*,
                               const float*);

}  // namespace fd::kernels
