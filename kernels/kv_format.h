// Pluggable storage formats of the KV-cache. A format fixes how one kv head's rows of a block are
// laid out (encoded on append) and supplies the attention kernel that reads them. Keys are stored
// row by row, for dot products along head_dim, except in a full f16 or q8 block ("sealed") and in
// every q4 block, whose keys are transposed so that a vector holds elements of consecutive keys
// and scores need no horizontal sums; q8/q4 values interleave four consecutive rows per element
// ("quads", padded to a multiple of 4 rows), for dot products along the keys.
//   f16: keys [block_tokens][head_dim], sealed in groups of kF16KeyGroup keys, each [head_dim][16]
//        (the last group as wide as the keys left); values [block_tokens][head_dim], sealed in
//        chunks of kF16ValueChunk elements, each [block_tokens][16] (the last chunk as wide as the
//        elements left); fp16. A scoring pass reads one key group, and a value pass one chunk, as
//        one run of memory (f16_sealed_key_index, f16_sealed_value_index).
//   q8 : [block_tokens] fp16 scales, then keys [block_tokens][head_dim] int8, sealed (head_dim
//        even) in groups of kQ8KeyGroup keys, each [head_dim/2][32][2] (pairs of elements, for
//        int16 pair products, or two pair rows interleaved for VNNI's four-byte products; the
//        last group as wide as the keys left), values in chunks of
//        kQ8ValueChunk elements, each [ceil(block_tokens/4)][32][4] int8 (row t, element i of a
//        chunk at (t/4, i, t%4); the last chunk as wide as the elements left), so that a scoring
//        pass over a group, and a value pass over a chunk, reads one run of memory
//        (q8_key_index, q8_value_index); x = q * scale, one scale per token per kv head
//        (fp16(max|x| / 127)).
//   q4 : fp16 scales [ceil(block_tokens/16)][head_dim/32][16] (the scales of 16 consecutive rows
//        side by side per group, so that one vector load serves a vector of keys or values),
//        then data. A row is head_dim/2 bytes: in group g byte j holds element 32g+j in its low
//        nibble and 32g+16+j in its high nibble, x = (nibble - 8) * scale with scale =
//        fp16(max|x in group| / 7). Keys: in groups of kQ4KeyGroup rows, each [head_dim/8][16][4]
//        (bytes [4s, 4s + 4) of row t at (t/16, s, t%16)), so that a vector holds four bytes of
//        consecutive keys and scores need no horizontal sums (q4_key_index); values:
//        [ceil(block_tokens/4)][head_dim/32][16][4] (byte j of group g of row t at
//        (t/4, g, j, t%4)).
// Attention quantizes the scaled query once per call (to int8, one scale per query vector) and
// scores keys with exact integer dot products. For the values it rounds, per query, per tile of
// kWeightTileKeys keys of a block (tiles start at multiples of it) and per scale group (q8: the
// row, q4: 32 elements), the weights w = probability * scale to integers in [0, W] with one fp32
// factor f = (largest probability) * (largest scale) / W of the tile, and
// accumulates integer dot products with the stored integers; f then scales each tile's sums.
// W = 127 for q8 (then pmaddubsw's pair sums of two int8 values fit int16) and 255 for q4.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/attention.h"

namespace fd::kernels {

// Which of a layer's two caches a row belongs to: the formats may lay them out differently.
enum class KvPart : uint8_t { key, value };

// Rows of a q4 block whose scales sit side by side per group, and rows per q4 key group (see the
// layouts above).
constexpr int kQ4ScaleRows = 16;
constexpr size_t kQ4KeyGroup = 16;

// Keys per tile of the quantized formats' value weights, a multiple of kQ4ScaleRows: 64, where
// a tile's softmax and weight rounding weigh little. One core of AMD EPYC (Zen 3), KV in L2, GQA 4:
// q4 hd128 read 4.5 GB/s with 16-key tiles, 5.5 with 32 and 5.4-5.8 with 64; q8 hd64 6.1 with 16,
// about 7 with 32 and 11 % more with 64.
constexpr int kWeightTileKeys = 4 * kQ4ScaleRows;

// Keys per group, and elements per chunk of the values, of a sealed f16 block.
constexpr size_t kF16KeyGroup = 16;
constexpr size_t kF16ValueChunk = 16;
// The same for q8 (whose values are chunked in every block).
constexpr size_t kQ8KeyGroup = 32;
constexpr size_t kQ8ValueChunk = 32;

class KvFormat {
 public:
  virtual ~KvFormat() = default;
  virtual KvDtype dtype() const = 0;
  virtual const char* name() const = 0;
  virtual bool supports(int head_dim) const = 0;
  // The head_dims it supports, in words (for errors).
  virtual std::string head_dims() const = 0;
  // Bytes of one kv head's block (q8/q4 round up to 64 so every head starts a cache line).
  virtual size_t head_block_bytes(int block_tokens, int head_dim) const = 0;
  // Where the store places a block's kv heads: the layout this format's attention reads fastest
  // on this CPU for blocks of block_tokens rows of head_dim (q4 has been tuned for kApart only).
  virtual KvLayout layout(int block_tokens, int head_dim) const {
    (void)block_tokens, (void)head_dim;
    return KvLayout::kApart;
  }
  // Encodes the fp16 row src [head_dim] as row t of a key or value head_block.
  virtual void encode_row(KvPart part, const uint16_t* src, int head_dim, int block_tokens, int t,
                          uint8_t* head_block) const = 0;
  // Fetches the cache lines that encode_row of row t will write, for writing, so that their misses
  // overlap other rows' encoding. Quantized rows are stored a few bytes per line (q8 values: 8
  // lines for hd128, a byte at a time), and the lines of a block a decode step appends to are
  // seldom still in cache. f16 rows go out with streaming stores and fetch nothing.
  virtual void prefetch_row(KvPart, int /*head_dim*/, int /*block_tokens*/, int /*t*/,
                            const uint8_t* /*head_block*/) const {}
  // Decodes row t of a key or value head_block into dst [head_dim] (the values attention reads).
  virtual void decode_row(KvPart part, const uint8_t* head_block, int head_dim, int block_tokens,
                          int t, float* dst) const = 0;
  // A block is written (encode_row) and read (decode_row) unsealed. The store seals each block when
  // its last row is written, and unseals it before rows of it are written again; attention reads
  // a block sealed exactly when all its block_tokens rows lie below the sequence's length. Only
  // f16 keys and values and q8 keys change layout (written row by row while the block fills: one
  // 2-byte store per row of the transposed block cost 1.5 us per hd128 key row from memory,
  // against 0.2).
  // scratch: head_block_bytes(block_tokens, head_dim) bytes the format may overwrite, so that
  // sealing allocates nothing and cannot fail halfway through a block's heads.
  virtual void seal(KvPart, uint8_t* /*head_block*/, int /*head_dim*/, int /*block_tokens*/,
                    uint8_t* /*scratch*/) const {}
  virtual void unseal(KvPart, uint8_t* /*head_block*/, int /*head_dim*/, int /*block_tokens*/,
                      uint8_t* /*scratch*/) const {}
  // Attention of every query row and head reading kv heads [kvh_begin, kvh_end); arguments as in
  // attention(). kv.dtype must be dtype(). stats: null, or [n_q][n_heads][2] for each output's
  // softmax max and denominator (see StoreStats in kernels/attention_tile.h).
  virtual void attend(const float* q, int n_q, int q_pos0, const KvBlocks& kv, const AttnDims& d,
                      int kvh_begin, int kvh_end, float* out, float* stats) const = 0;
};

// The format of a dtype (immutable, lives for the whole program).
const KvFormat& kv_format(KvDtype dtype);
const char* kv_dtype_name(KvDtype dtype);
// Every KvDtype.
constexpr KvDtype kKvDtypes[] = {KvDtype::f16, KvDtype::q8, KvDtype::q4};
// "f16", "int8 (q8)" or "int4 (q4)": the name and the short one, for messages.
std::string kv_dtype_label(KvDtype dtype);
// Parses "f16", "int8" or "int4", and the short names "q8" and "q4"; false for anything else.
bool parse_kv_dtype(const std::string& s, KvDtype* dtype);
// "apart" or "side" (side by side), and back.
const char* kv_layout_name(KvLayout layout);
bool parse_kv_layout(const std::string& s, KvLayout* layout);

namespace detail {
// The per-target attention kernels for every dtype (kernels/attention.cc); head_bytes is the
// format's head_block_bytes.
void attend_heads(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                  const AttnDims& d, int kvh_begin, int kvh_end, float* out, float* stats);
// The same for the q8 and q4 formats (kernels/attention_quant.cc).
void attend_quant_heads(const float* q, int n_q, int q_pos0, const KvBlocks& kv, size_t head_bytes,
                        const AttnDims& d, int kvh_begin, int kvh_end, float* out, float* stats);

// The key group or value chunk that holds item x of n, in runs of `run` items (the last one as
// long as the items left): its first item and its length.
struct Run {
  size_t start, width;
};
inline Run run_of(size_t x, size_t run, size_t n) {
  const size_t start = x / run * run;
  return {start, std::min(run, n - start)};
}

// f16 layout: index of element i of row t in a sealed head block of bt rows and head_dim hd (in a
// block not yet full it is t * hd + i).
inline size_t f16_sealed_key_index(size_t t, size_t i, size_t head_dim, size_t block_tokens) {
  const Run g = run_of(t, kF16KeyGroup, block_tokens);
  return g.start * head_dim + i * g.width + (t - g.start);
}
inline size_t f16_sealed_value_index(size_t t, size_t i, size_t head_dim, size_t block_tokens) {
  const Run c = run_of(i, kF16ValueChunk, head_dim);
  return c.start * block_tokens + t * c.width + (i - c.start);
}

// q4 layout: index of the fp16 scale of row t, group g (of `groups` per row), and byte offset of
// the data, from the start of a head block; byte c of key row t, from the start of the data.
inline size_t q4_scale_index(size_t t, size_t g, size_t groups) {
  return (t / kQ4ScaleRows * groups + g) * kQ4ScaleRows + t % kQ4ScaleRows;
}
inline size_t q4_data_offset(size_t block_tokens, size_t groups) {
  return (block_tokens + kQ4ScaleRows - 1) / kQ4ScaleRows * kQ4ScaleRows * groups * sizeof(uint16_t);
}
inline size_t q4_key_index(size_t t, size_t c, size_t head_dim) {
  return ((t / kQ4KeyGroup * (head_dim / 8) + c / 4) * kQ4KeyGroup + t % kQ4KeyGroup) * 4 + c % 4;
}
// Byte offset of a q8 head block's data, from its start: after its block_tokens fp16 scales.
inline size_t q8_data_offset(size_t block_tokens) { return block_tokens * sizeof(uint16_t); }
// Byte of row t, element i of a q8 key block's data (transposed when sealed, see
// q8_seals_keys), and of a q8 value block's data, and of row t, group g, byte j of a q4 value
// block's data (all from the start of the data).
inline bool q8_seals_keys(size_t head_dim) { return head_dim % 2 == 0; }
inline size_t q8_key_index(bool sealed, size_t t, size_t i, size_t head_dim, size_t block_tokens) {
  if (!sealed) return t * head_dim + i;
  const Run g = run_of(t, kQ8KeyGroup, block_tokens);
  return g.start * head_dim + (i / 2 * g.width + (t - g.start)) * 2 + i % 2;
}
inline size_t q8_value_index(size_t t, size_t i, size_t head_dim, size_t block_tokens) {
  const Run c = run_of(i, kQ8ValueChunk, head_dim);
  return (c.start * ((block_tokens + 3) / 4) + t / 4 * c.width + (i - c.start)) * 4 + t % 4;
}
// Key row t of a q8 head block into dst [head_dim]: decode_row's keys, also from a sealed block.
void q8_decode_key_row(const uint8_t* head_block, bool sealed, size_t head_dim, size_t block_tokens, size_t t,
                       float* dst);
inline size_t q4_value_index(size_t t, size_t g, size_t j, size_t groups) {
  return ((t / 4 * groups + g) * 16 + j) * 4 + t % 4;
}
}  // namespace detail

}  // namespace fd::kernels
