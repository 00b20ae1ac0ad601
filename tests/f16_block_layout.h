// Where a block of the f16 KV format keeps each element (kernels/kv_format.h), written out
// independently of the kernels, for the tests that build blocks by hand or check the store's.
#pragma once
#include <cstddef>

namespace f16_block_layout {

// Element i of kv head h, token t, in a block of bt tokens and head_dim hd: [h][bt][hd].
inline size_t value_index(size_t t, size_t h, size_t i, size_t hd, size_t bt) { return (h * bt + t % bt) * hd + i; }

// The same for keys of a sequence of len tokens: as values, except that a full ("sealed") block
// holds them transposed, [h][hd][bt].
inline size_t key_index(size_t t, size_t h, size_t i, size_t hd, size_t bt, size_t len) {
  const bool sealed = (t / bt + 1) * bt <= len;
  return sealed ? (h * hd + i) * bt + t % bt : value_index(t, h, i, hd, bt);
}

}  // namespace f16_block_layout
