// Row quantizers of the q8 and q4 KV formats (layouts in kernels/kv_format.h), vectorized per
// target: the store runs them on every K and V row it appends.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fd::kernels {

// q[i] = round(x[i] / scale) in [-127, 127], ties to even, for the fp16 row x [n] (n <= 256);
// returns the bits of scale = fp16(max|x| / 127), the grid the integers are on. A row with a NaN
// or an infinity gets a NaN scale and zeros.
uint16_t quantize_row_q8(const uint16_t* x, size_t n, int8_t* q);

// For each group g of 32 elements of the fp16 row x [n] (n a multiple of 32, at most 256): its
// scale s = fp16(max|x in g| / 7) into scales[g], and bytes[16 g + j] = the nibbles
// round(x / s) + 8 (in [1, 15], ties to even) of elements 32g + j (low) and 32g + 16 + j (high).
// A group with a NaN or an infinity gets a NaN scale and nibbles 8.
void quantize_row_q4(const uint16_t* x, size_t n, uint8_t* bytes, uint16_t* scales);

}  // namespace fd::kernels
