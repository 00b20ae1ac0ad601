#include "kernels/cuda/launch.h"

#include <algorithm>

#include "kernels/cuda/ops.cuh"

namespace fd::kernels::cuda {
namespace {

constexpr int kElemThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill any current GPU, no more.
unsigned elem_blocks(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kElemThreads - 1) / kElemThreads, 8192));
}

const __half* as_half(const uint16_t* p) { return reinterpret_cast<const __half*>(p); }
__half* as_half(uint16_t* p) { return reinterpret_cast<__half*>(p); }

}  // namespace

cudaError_t f32_to_f16(const float* x, uint16_t* y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  f32_to_f16_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(x, as_half(y), n);
  return cudaGetLastError();
}

cudaError_t embed(const int32_t* tokens, const uint16_t* table, float* x, int rows, int dim,
                  cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  embed_kernel<<<rows, kRowThreads, 0, stream>>>(tokens, as_half(table), x, dim);
  return cudaGetLastError();
}

cudaError_t rmsnorm(const float* x, const int32_t* row_idx, const float* w, uint16_t* y, int rows,
                    int dim, float eps, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  rmsnorm_kernel<<<rows, kRowThreads, 0, stream>>>(x, row_idx, w, as_half(y), dim, eps);
  return cudaGetLastError();
}

cudaError_t qkv_rope(const float* qkv, const int32_t* pos, int rows, int n_heads, int n_kv_heads,
                     int head_dim, float theta_scale, float* q, uint16_t* k, uint16_t* v,
                     cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(head_dim) * sizeof(float);
  qkv_rope_kernel<<<rows, kRowThreads, shared, stream>>>(qkv, pos, n_heads, n_kv_heads, head_dim,
                                                         theta_scale, q, as_half(k), as_half(v));
  return cudaGetLastError();
}

cudaError_t swiglu(const float* gate_up, uint16_t* h, int rows, int ff, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(ff);
  if (n == 0) return cudaSuccess;
  swiglu_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(gate_up, as_half(h), ff, n);
  return cudaGetLastError();
}

}  // namespace fd::kernels::cuda
