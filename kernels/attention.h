// Decode and prefill attention over a paged fp16 KV-cache: fp16 in memory, fp32 in registers.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fd::kernels {

struct AttnDims {
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // n_heads % n_kv_heads == 0; query head h reads kv head h / (n_heads/n_kv_heads)
  int head_dim = 0;
};

// Where a block's kv heads lie. kApart: k[b] and v[b] each point at [n_kv_heads][head block], the
// K of all kv heads in one run and their V in another. kSideBySide: k[b] points at
// [n_kv_heads][K head block, V head block] and v[b] = k[b] + one head block, so that each kv
// head's K and V are one run.
enum class KvLayout : uint8_t { kApart = 0, kSideBySide = 1 };

// Bytes from kv head h's K (or V) block to kv head h + 1's.
inline size_t kv_head_stride(KvLayout layout, size_t head_block_bytes) {
  return layout == KvLayout::kSideBySide ? 2 * head_block_bytes : head_block_bytes;
}

// K/V of one sequence and one layer. Block b holds tokens [b*block_tokens, (b+1)*block_tokens);
// each kv head's K and V head blocks (placed as `layout` says) hold [block_tokens][head_dim] fp16
// keys and values while the block is not full ((b+1)*block_tokens > len), and the f16 format's
// sealed layout once it is: keys in groups of 16 transposed, values in chunks of 16 elements
// (kernels/kv_format.h).
struct KvBlocksF16 {
  const uint16_t* const* k = nullptr;
  const uint16_t* const* v = nullptr;
  int block_tokens = 0;
  int len = 0;  // valid tokens
  KvLayout layout = KvLayout::kApart;
};

// Causal attention for n_q query rows of one sequence. Row i sits at position q_pos0 + i and
// attends keys [0, q_pos0 + i], which must all be < kv.len. Scale 1/sqrt(head_dim).
// q, out: [n_q][n_heads][head_dim] fp32. Throws std::invalid_argument when head_dim > 256, the
// head counts do not divide, or a row lies beyond kv.len.
void attention_f16(const float* q, int n_q, int q_pos0, const KvBlocksF16& kv, const AttnDims& d,
                   float* out);

class ThreadPool;

// How K/V rows are stored: fp16, or quantized with fp32 scales (see kernels/kv_format.h).
enum class KvDtype : uint8_t { f16 = 0, q8 = 1, q4 = 2 };

// K/V of one sequence and one layer in any KvDtype. Block b holds tokens
// [b*block_tokens, (b+1)*block_tokens); its kv heads' K and V head blocks of
// KvFormat::head_block_bytes each are placed as `layout` says (for f16 exactly the KvBlocksF16
// layout).
struct KvBlocks {
  KvDtype dtype = KvDtype::f16;
  const uint8_t* const* k = nullptr;
  const uint8_t* const* v = nullptr;
  int block_tokens = 0;
  int len = 0;  // valid tokens
  KvLayout layout = KvLayout::kApart;
};

// attention_f16 for any KvDtype; throws std::invalid_argument for a head_dim the dtype cannot hold.
void attention(const float* q, int n_q, int q_pos0, const KvBlocks& kv, const AttnDims& d, float* out);

// One sequence's share of a batched call: the arguments of attention_f16 / attention.
struct AttnItemF16 {
  const float* q = nullptr;  // [n_q][n_heads][head_dim]
  float* out = nullptr;      // [n_q][n_heads][head_dim]
  int n_q = 1;
  int q_pos0 = 0;
  KvBlocksF16 kv;
};
struct AttnItem {
  const float* q = nullptr;  // [n_q][n_heads][head_dim]
  float* out = nullptr;      // [n_q][n_heads][head_dim]
  int n_q = 1;
  int q_pos0 = 0;
  KvBlocks kv;
};

// Attention for n items, split into work units over the pool's threads: ranges of an item's kv
// heads and, for a costly prefill, of its rows (kernels/attention_units.h). Each unit is computed
// by one thread in a fixed order, and rows are cut only where the kernel's query tiles end, so
// results do not depend on the thread count.
void attention_batch_f16(const AttnItemF16* items, size_t n, const AttnDims& d, ThreadPool& pool);
void attention_batch(const AttnItem* items, size_t n, const AttnDims& d, ThreadPool& pool);

// The layout attention_f16 reads fastest on this CPU (the f16 KV store's, KvFormat::layout).
KvLayout f16_layout();
// The layout the q8 kernel reads fastest on this CPU for head blocks of head_bytes (the q8
// store's).
KvLayout q8_layout(size_t head_bytes);

// How far above its reference m the kernels (fp16 and quantized) let a query's scores lie before
// they move m to their max (KeepsReferences in kernels/attention-inl.h): softmax weights
// exp(s - m) reach up to e^8, about 3000, and StoreStats' m is at most this much below the
// largest score.
constexpr float kSoftmaxSlack = 8.0f;
// y[i] = exp(x[i]) for x[i] <= 0, as the kernels rescale a query's sums when its max grows
// (exposed for tests): within 2 ulp where exp(x) >= FLT_MIN, 0 for x < -87.7 and for -inf.
void softmax_exp(const float* x, float* y, size_t n);
// The same for x[i] <= kSoftmaxSlack, as the fp16 kernel computes its softmax weights: within
// 2 (1 + |x|) ulp where exp(x) >= FLT_MIN (on AVX-512; 2 ulp elsewhere), 0 below and for -inf.
void softmax_weight_exp(const float* x, float* y, size_t n);
// The same to 1.3e-4 relative error, as the quantized formats compute their weights (which they
// round to at most 8 bits).
void softmax_exp_coarse(const float* x, float* y, size_t n);

}  // namespace fd::kernels
