// How attention_batch cuts its work into units (kernels/attention_units.h), checked against a
// direct count of every (item, kv head, row) and of the keys each row sees.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "kernels/attention_units.h"

namespace {

using fd::kernels::AttnItem;
using fd::kernels::AttnUnit;

AttnItem rows(int n_q, int q_pos0) {
  AttnItem it;
  it.n_q = n_q;
  it.q_pos0 = q_pos0;
  return it;
}

// Keys seen by rows [r0, r1) of `it`, one by one.
uint64_t keys_of(const AttnItem& it, int r0, int r1) {
  uint64_t k = 0;
  for (int r = r0; r < r1; ++r) k += uint64_t(it.q_pos0 + r + 1);
  return k;
}

uint64_t total_cost(const std::vector<AttnItem>& items, int kv_heads) {
  uint64_t c = 0;
  for (const auto& it : items) c += keys_of(it, 0, it.n_q) * uint64_t(kv_heads);
  return c;
}

// Every (item, kv head, row) in exactly one unit, or, for a single-row item, in key-range units
// of one kv head whose ranges cover its keys once, cut at multiples of its block size; rows cut
// only at multiples of kUnitRowAlign; each unit's cost its keys; costliest first.
void check_cover(const std::vector<AttnItem>& items, int kv_heads, const std::vector<AttnUnit>& units) {
  std::vector<std::vector<int>> hits(items.size());
  for (size_t i = 0; i < items.size(); ++i) hits[i].assign(size_t(std::max(items[i].n_q, 0)) * kv_heads, 0);
  std::map<std::pair<size_t, int>, std::vector<std::pair<int, int>>> ranges;  // (item, kv head): key ranges
  size_t bad_cut = 0, bad_cost = 0, bad_range = 0, bad_part = 0;
  int parts = 0;  // key-range units take the scratch slots 0, 1, ... in plan order
  for (const AttnUnit& u : units) {
    REQUIRE(u.item < items.size());
    bad_part += u.part != (u.key_end > 0 ? parts++ : -1);
    const AttnItem& it = items[u.item];
    if (u.kvh_begin < 0 || u.kvh_end > kv_heads || u.kvh_begin >= u.kvh_end || u.row_begin < 0 ||
        u.row_end > it.n_q || u.row_begin >= u.row_end) {
      ++bad_range;
      continue;
    }
    if (u.key_end > 0) {
      bad_range += it.n_q != 1 || u.kvh_end != u.kvh_begin + 1 || u.key_begin < 0 || u.key_begin >= u.key_end ||
                   u.key_end > it.q_pos0 + 1;
      bad_cost += u.cost != uint64_t(u.key_end - u.key_begin);
      ranges[{u.item, u.kvh_begin}].push_back({u.key_begin, u.key_end});
      continue;
    }
    bad_cut += u.row_begin % fd::kernels::kUnitRowAlign != 0;
    bad_cut += u.row_end != it.n_q && u.row_end % fd::kernels::kUnitRowAlign != 0;
    bad_cost += u.cost != keys_of(it, u.row_begin, u.row_end) * uint64_t(u.kvh_end - u.kvh_begin);
    for (int h = u.kvh_begin; h < u.kvh_end; ++h)
      for (int r = u.row_begin; r < u.row_end; ++r) ++hits[u.item][size_t(r) * kv_heads + size_t(h)];
  }
  for (auto& [at, r] : ranges) {
    const AttnItem& it = items[at.first];
    const int bt = std::max(it.kv.block_tokens, 1);
    std::sort(r.begin(), r.end());
    int next = 0;
    for (const auto& [k0, k1] : r) {
      bad_cut += k0 != next || (k1 != it.q_pos0 + 1 && k1 % bt != 0);
      next = k1;
    }
    bad_cut += next != it.q_pos0 + 1;
    ++hits[at.first][size_t(at.second)];
  }
  CHECK(bad_range == 0);
  CHECK(bad_part == 0);
  CHECK(bad_cut == 0);
  CHECK(bad_cost == 0);
  size_t not_once = 0;
  for (const auto& h : hits)
    for (int x : h) not_once += x != 1;
  CHECK(not_once == 0);
  CHECK(std::is_sorted(units.begin(), units.end(), [](const AttnUnit& a, const AttnUnit& b) { return a.cost > b.cost; }));
}

}  // namespace

TEST_CASE("Attention units cover every item, kv head and row once, for any mix", "[attention]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int kv_heads = 1 + int(rng() % 8), threads = 1 + int(rng() % 8);
    std::vector<AttnItem> items;
    const int n = int(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const int kind = int(rng() % 4);  // decode, empty, short or long prefill
      const int n_q = kind == 0 ? 1 : kind == 1 ? 0 : kind == 2 ? 1 + int(rng() % 20) : 1 + int(rng() % 700);
      items.push_back(rows(n_q, int(rng() % 600)));
    }
    INFO("trial " << trial << " kv heads " << kv_heads << " threads " << threads << " items " << n);
    check_cover(items, kv_heads, fd::kernels::plan_attention_units(items.data(), items.size(), kv_heads, threads));
  }
}

TEST_CASE("A long prefill beside decode rows is cut so that every thread gets work", "[attention]") {
  // One 2048-token prompt and 63 decoding sequences at 2048 tokens, 8 kv heads, 2 threads: one
  // unit per sequence put the whole prefill on one thread.
  std::vector<AttnItem> items{rows(2048, 0)};
  for (int i = 0; i < 63; ++i) items.push_back(rows(1, 2047));
  const int kv_heads = 8, threads = 2;
  const auto units = fd::kernels::plan_attention_units(items.data(), items.size(), kv_heads, threads);
  check_cover(items, kv_heads, units);
  const uint64_t total = total_cost(items, kv_heads), limit = (total + 4 * threads - 1) / (4 * threads);
  size_t prefill_units = 0;
  for (const AttnUnit& u : units) {
    CHECK(u.cost <= limit);
    prefill_units += u.item == 0;
  }
  CHECK(prefill_units >= size_t(4 * threads));
  CHECK(units.front().item == 0);  // the prefill's units go first

  // With 16 threads one kv head of the prefill is more than a unit may cost: its rows are cut too.
  const auto wide = fd::kernels::plan_attention_units(items.data(), items.size(), kv_heads, 16);
  check_cover(items, kv_heads, wide);
  const uint64_t wide_limit = (total + 63) / 64;
  size_t row_cut = 0;
  for (const AttnUnit& u : wide) {
    CHECK(u.cost <= wide_limit + keys_of(items[0], 2040, 2048));  // within a row range's rounding
    row_cut += u.item == 0 && (u.row_begin > 0 || u.row_end < 2048);
  }
  CHECK(row_cut > 0);
}

TEST_CASE("A prefill over fewer kv heads than threads is cut into row ranges of equal cost", "[attention]") {
  const std::vector<AttnItem> items{rows(1000, 24)};
  for (int threads : {2, 4, 16}) {
    INFO("threads " << threads);
    const auto units = fd::kernels::plan_attention_units(items.data(), 1, 1, threads);
    check_cover(items, 1, units);
    CHECK(units.size() >= size_t(4 * threads));
    const uint64_t total = total_cost(items, 1);
    const uint64_t limit = (total + 4 * uint64_t(threads) - 1) / (4 * uint64_t(threads));
    for (const AttnUnit& u : units) CHECK(u.cost <= limit + keys_of(items[0], 992, 1000));
  }
}

TEST_CASE("Decode batches keep a sequence's kv heads in one unit when there are enough sequences", "[attention]") {
  std::vector<AttnItem> items;
  for (int i = 0; i < 16; ++i) items.push_back(rows(1, 500 + 37 * (i % 3)));
  const auto units = fd::kernels::plan_attention_units(items.data(), items.size(), 8, 2);
  check_cover(items, 8, units);
  CHECK(units.size() == items.size());
  for (const AttnUnit& u : units) CHECK((u.kvh_begin == 0 && u.kvh_end == 8));
  // One sequence: its kv heads are spread, one per unit.
  const auto one = fd::kernels::plan_attention_units(items.data(), 1, 8, 2);
  check_cover({items[0]}, 8, one);
  CHECK(one.size() == 8);
  // One thread: one unit per item, whatever it costs.
  const std::vector<AttnItem> prefill{rows(3000, 0)};
  const auto inline_units = fd::kernels::plan_attention_units(prefill.data(), 1, 4, 1);
  REQUIRE(inline_units.size() == 1);
  CHECK((inline_units[0].kvh_end == 4 && inline_units[0].row_end == 3000));
}

TEST_CASE("A few decoding sequences over fewer kv heads than threads are cut into key ranges of whole blocks",
          "[attention]") {
  AttnItem one = rows(1, 4095);
  one.kv.block_tokens = 64;
  for (int threads : {2, 4, 16}) {
    INFO("threads " << threads);
    const auto units = fd::kernels::plan_attention_units(&one, 1, 1, threads);
    check_cover({one}, 1, units);
    // 1/threads of the keys each, and kMinKeyRange at least.
    CHECK(units.size() == size_t(std::min<uint64_t>(uint64_t(threads), 4096 / fd::kernels::kMinKeyRange)));
    for (const AttnUnit& u : units) CHECK(u.key_end > 0);
  }
  // Eight kv heads over 16 threads: each head is cut in two.
  const auto wide = fd::kernels::plan_attention_units(&one, 1, 8, 16);
  check_cover({one}, 8, wide);
  CHECK(wide.size() >= 16);
  // A context of one block is not cut; nor are enough units (a kv head per thread) or a prefill.
  AttnItem short_ctx = one;
  short_ctx.q_pos0 = 40;
  const auto whole = fd::kernels::plan_attention_units(&short_ctx, 1, 1, 4);
  check_cover({short_ctx}, 1, whole);
  CHECK(whole.size() == 1);
  for (const auto& u : fd::kernels::plan_attention_units(&one, 1, 2, 2)) CHECK(u.key_end == 0);
  AttnItem prompt = rows(2, 4094);
  prompt.kv.block_tokens = 64;
  for (const auto& u : fd::kernels::plan_attention_units(&prompt, 1, 1, 4)) CHECK(u.key_end == 0);
}
