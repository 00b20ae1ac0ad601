// Memory-bandwidth helpers: the probe (a read-only sum, the access pattern of attention over a
// KV-cache) and streaming writes.
#pragma once
#include <cstddef>

namespace fd::kernels {

// Sum of x[0..n) (fp32 lanes, several independent accumulators).
double sum_f32(const float* x, size_t n);

// Copies `bytes` from src to dst with non-temporal stores when dst is aligned to the vector size
// and bytes is a multiple of it (memcpy otherwise). For data written now and read much later,
// such as KV-cache rows: the lines go to memory without first being read into the cache, which
// costs a full memory round trip per line when the rows are scattered. Call streaming_fence()
// before another thread may read dst.
void copy_streaming(void* dst, const void* src, size_t bytes);
// Orders the streaming stores made so far before the stores that follow.
void streaming_fence();

}  // namespace fd::kernels
