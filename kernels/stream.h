// Memory-bandwidth probe: a read-only sum, the access pattern of attention over a KV-cache.
#pragma once
#include <cstddef>

namespace fd::kernels {

// Sum of x[0..n) (fp32 lanes, several independent accumulators).
double sum_f32(const float* x, size_t n);

}  // namespace fd::kernels
