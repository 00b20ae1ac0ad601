// KV-cache set-up shared by the attention benchmarks (bench_attention, bench_prefill).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "runtime/kv_store.h"

namespace fd {

// A store of `layers` layers of this shape with room for exactly `pages` pages, its kv heads laid
// out as `layout` says (unset: the dtype's choice for this CPU).
KvStoreConfig bench_store_config(kernels::KvDtype dtype, int layers, int kv_heads, int head_dim, int block_tokens,
                                 size_t pages, std::optional<kernels::KvLayout> layout);

// --kv-layout: "auto" (unset), "apart" or "side"; throws fd::Error naming anything else.
std::optional<kernels::KvLayout> parse_kv_layout_option(const std::string& s);
// The help text of --kv-layout.
extern const char* const kKvLayoutHelp;

// k, v: n random fp16 values each, uniform in [-1, 1).
void random_f16_rows(std::mt19937& rng, size_t n, std::vector<uint16_t>& k, std::vector<uint16_t>& v);

}  // namespace fd
