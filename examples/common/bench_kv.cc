#include "examples/common/bench_kv.h"

#include "kernels/ops.h"

namespace fd {

KvStoreConfig bench_store_config(kernels::KvDtype dtype, int layers, int kv_heads, int head_dim, int block_tokens,
                                 size_t pages) {
  KvStoreConfig cfg;
  cfg.n_layers = layers;
  cfg.n_kv_heads = kv_heads;
  cfg.head_dim = head_dim;
  cfg.block_tokens = block_tokens;
  cfg.dtype = dtype;
  cfg.capacity_bytes = kv_page_bytes(cfg) * pages;
  return cfg;
}

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
