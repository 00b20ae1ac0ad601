// Decode and prefill attention over a paged fp16 KV-cache: fp16 in memory, fp32 in registers.
#pragma once
#include <cstdint>

namespace fd::kernels {

struct AttnDims {
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // n_heads % n_kv_heads == 0; query head h reads kv head h / (n_heads/n_kv_heads)
  int head_dim = 0;
};

// K/V of one sequence and one layer. Block b holds tokens [b*block_tokens, (b+1)*block_tokens);
// k[b] and v[b] each point at [n_kv_heads][block_tokens][head_dim] fp16 values.
struct KvBlocksF16 {
  const uint16_t* const* k = nullptr;
  const uint16_t* const* v = nullptr;
  int block_tokens = 0;
  int len = 0;  // valid tokens
};

// Causal attention for n_q query rows of one sequence. Row i sits at position q_pos0 + i and
// attends keys [0, q_pos0 + i], which must all be < kv.len. Scale 1/sqrt(head_dim).
// q, out: [n_q][n_heads][head_dim] fp32.
void attention_f16(const float* q, int n_q, int q_pos0, const KvBlocksF16& kv, const AttnDims& d,
                   float* out);

}  // namespace fd::kernels
