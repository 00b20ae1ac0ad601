// Where a block of the f16 KV format keeps each element (kernels/kv_format.h), written out
// independently of the kernels, for the tests that build blocks by hand or check the store's.
#pragma once
#include <cstddef>

namespace f16_block_layout {

// A block of bt tokens is full ("sealed") when the sequence's len tokens reach its end.
inline bool sealed(size_t t, size_t bt, size_t len) { return (t / bt + 1) * bt <= len; }

// Element i of kv head h, token t, in a block of bt tokens and head_dim hd, whose kv heads lie
// head_stride elements apart (0: bt * hd, heads packed; 2 * bt * hd where each head's K and V lie
// side by side). Unsealed: [bt][hd] per head. Sealed: per head, the keys in groups of 16 tokens
// (the last group holding the tokens left), each group [hd][its tokens].
inline size_t key_index(size_t t, size_t h, size_t i, size_t hd, size_t bt, size_t len, size_t head_stride = 0) {
  const size_t r = t % bt, head = h * (head_stride != 0 ? head_stride : bt * hd);
  if (!sealed(t, bt, len)) return head + r * hd + i;
  const size_t group = r / 16, tokens = bt - group * 16 < 16 ? bt - group * 16 : 16;
  return head + group * 16 * hd + i * tokens + r % 16;
}

// The same for values. Sealed: per head, the elements in chunks of 16 (the last chunk holding the
// elements left), each chunk [bt][its elements].
inline size_t value_index(size_t t, size_t h, size_t i, size_t hd, size_t bt, size_t len, size_t head_stride = 0) {
  const size_t r = t % bt, head = h * (head_stride != 0 ? head_stride : bt * hd);
  if (!sealed(t, bt, len)) return head + r * hd + i;
  const size_t chunk = i / 16, elements = hd - chunk * 16 < 16 ? hd - chunk * 16 : 16;
  return head + chunk * 16 * bt + r * elements + i % 16;
}

}  // namespace f16_block_layout
