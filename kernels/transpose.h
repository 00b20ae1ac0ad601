// Transposes of 16-bit elements: the KV formats' seals turn key rows into key groups with them
// (kernels/kv_format.h).
#pragma once
#include <cstddef>
#include <cstdint>

namespace fd::kernels {

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols (strides in elements;
// src and dst must not overlap).
void transpose_u16(const uint16_t* src, size_t rows, size_t cols, size_t src_stride, uint16_t* dst,
                   size_t dst_stride);

}  // namespace fd::kernels
