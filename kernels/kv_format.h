// Pluggable storage formats of the KV-cache. A format fixes how one kv head's rows of a block are
// laid out (encoded on append) and supplies the attention kernel that reads them.
//   f16: [block_tokens][head_dim] fp16.
//   q8 : [block_tokens] fp32 scales, then [block_tokens][head_dim] int8; x = q * scale, one
//        scale per token per kv head (max|x| / 127).
//   q4 : [ceil(block_tokens/4)][head_dim/32][4] fp16 scales (the scales of four consecutive rows
//        sit side by side per group, so that one vector load serves four rows), then
//        [block_tokens][head_dim/32][16] bytes; in group g byte j holds element 32g+j in its low
//        nibble and 32g+16+j in its high nibble, x = (nibble - 8) * scale with
//        scale = fp16(max|x in group| / 7).
// Attention quantizes the scaled query once per call (q8: int16, q4: int8, one scale per query
// vector) and scores keys with exact integer dot products; values are accumulated in fp32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/attention.h"

namespace fd::kernels {

class KvFormat {
 public:
  virtual ~KvFormat() = default;
  virtual KvDtype dtype() const = 0;
  virtual const char* name() const = 0;
  virtual bool supports(int head_dim) const = 0;
  // Bytes of one kv head's block (q8/q4 round up to 64 so every head starts a cache line).
  virtual size_t head_block_bytes(int block_tokens, int head_dim) const = 0;
  // Encodes the fp16 row src [head_dim] as row t of head_block.
  virtual void encode_row(const uint16_t* src, int head_dim, int block_tokens, int t,
                          uint8_t* head_block) const = 0;
  // Decodes row t of head_block into dst [head_dim] (the values attention reads).
  virtual void decode_row(const uint8_t* head_block, int head_dim, int block_tokens, int t,
                          float* dst) const = 0;
  // Attention of every query row and head reading kv heads [kvh_begin, kvh_end); arguments as in
  // attention(). kv.dtype must be dtype().
  virtual void attend(const float* q, int n_q, int q_pos0, const KvBlocks& kv, const AttnDims& d,
                      int kvh_begin, int kvh_end, float* out) const = 0;
};

// The format of a dtype (immutable, lives for the whole program).
const KvFormat& kv_format(KvDtype dtype);
const char* kv_dtype_name(KvDtype dtype);
// Parses "f16", "q8" or "q4"; false for anything else.
bool parse_kv_dtype(const std::string& s, KvDtype* dtype);

namespace detail {
// The per-target attention kernels for every dtype (kernels/attention.cc); head_bytes is the
// format's head_block_bytes.
void attend_heads(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                  const AttnDims& d, int kvh_begin, int kvh_end, float* out);
// The same for the q8 and q4 formats (kernels/attention_quant.cc).
void attend_quant_heads(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                        const AttnDims& d, int kvh_begin, int kvh_end, float* out);

// q4 layout: index of the fp16 scale of row t, group g (of `groups` per row), and byte offset of
// the nibbles, from the start of a head block.
inline size_t q4_scale_index(size_t t, size_t g, size_t groups) { return (t / 4 * groups + g) * 4 + t % 4; }
inline size_t q4_data_offset(size_t block_tokens, size_t groups) {
  return (block_tokens + 3) / 4 * 4 * groups * sizeof(uint16_t);
}
}  // namespace detail

}  // namespace fd::kernels
