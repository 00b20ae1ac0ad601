#include "examples/common/bench_kv.h"

#include "kernels/ops.h"

namespace fd {

KvStoreConfig bench_store_config(kernels::KvDtype dtype, int layers, int kv_heads, int head_dim, int block_tokens,
                                 size_t pages, std::optional<kernels::KvLayout> layout) {
  KvStoreConfig cfg;
  cfg.layout = layout;
  cfg.n_layers = layers;
  cfg.n_kv_heads = kv_heads;
  cfg.head_dim = head_dim;
  cfg.block_tokens = block_tokens;
  cfg.dtype = dtype;
  cfg.capacity_bytes = kv_page_bytes(cfg) * pages;
  return cfg;
}

std::optional<kernels::KvLayout> parse_kv_layout_option(const std::string& s) {
  if (s == "auto") return std::nullopt;
  kernels::KvLayout l;
  if (!kernels::parse_kv_layout(s, &l)) throw Error("--kv-layout must be auto, apart or side, not '" + s + "'.");
  return l;
}

const char* const kKvLayoutHelp =
    "where a page's kv heads lie: apart (the K of all heads, their V elsewhere), side (each head's K "
    "and V side by side) or auto (each kv dtype's choice for this CPU)";

void random_f16_rows(std::mt19937& rng, size_t n, std::vector<uint16_t>& k, std::vector<uint16_t>& v) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> f(n);
  k.resize(n);
  v.resize(n);
  for (auto& x : f) x = dist(rng);
  kernels::f32_to_f16(f.data(), k.data(), n);
  for (auto& x : f) x = dist(rng);
  kernels::f32_to_f16(f.data(), v.data(), n);
}

}  // namespace fd
