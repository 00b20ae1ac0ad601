// CUDA kernels of the S-part; launched only by kernels/cuda/launch.cu. The per-element formulas
// come from kernels/elementwise.h, shared with the CPU kernels.
#pragma once
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/elementwise.h"

namespace fd::kernels::cuda {

// Threads of the one-block-per-row kernels; a multiple of 32 (block_sum needs whole warps).
constexpr int kRowThreads = 256;

// The sum of v over the block, returned to every thread. blockDim.x: a multiple of 32, <= 1024.
__device__ inline float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// x, y: [n]
__global__ void f32_to_f16_kernel(const float* __restrict__ x, __half* __restrict__ y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = __float2half_rn(x[i]);
}

// One block per row. tokens: [rows]; table: [vocab][dim]; x: [rows][dim]
__global__ void embed_kernel(const int32_t* __restrict__ tokens, const __half* __restrict__ table,
                             float* __restrict__ x, int dim) {
  const __half* e = table + static_cast<size_t>(tokens[blockIdx.x]) * dim;
  float* xr = x + static_cast<size_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = __half2float(e[i]);
}

// One block per output row. x: [*][dim]; row_idx: [rows] or null; w: [dim]; y: [rows][dim]
__global__ void rmsnorm_kernel(const float* __restrict__ x, const int32_t* __restrict__ row_idx,
                               const float* __restrict__ w, __half* __restrict__ y, int dim,
                               float eps) {
  const int r = blockIdx.x;
  const float* xr = x + static_cast<size_t>(row_idx ? row_idx[r] : r) * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  const float scale = rmsnorm_scale(block_sum(ss) / static_cast<float>(dim), eps);
  __half* yr = y + static_cast<size_t>(r) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = __float2half_rn(xr[i] * scale * w[i]);
}

// One block per row; dynamic shared memory: head_dim floats, the [head_dim/2][cos, sin] table
// of the row's position, shared by every Q and K head.
// qkv: [rows][qw + 2*kvw]; pos: [rows]; q: [rows][qw]; k, v: [rows][kvw]
__global__ void qkv_rope_kernel(const float* __restrict__ qkv, const int32_t* __restrict__ pos,
                                int n_heads, int n_kv_heads, int head_dim, float theta_scale,
                                float* __restrict__ q, __half* __restrict__ k,
                                __half* __restrict__ v) {
  extern __shared__ float cs[];
  const int r = blockIdx.x;
  const int qw = n_heads * head_dim, kvw = n_kv_heads * head_dim;
  for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x) {
    const float theta = rope_theta(pos[r], theta_scale, i);
    cs[2 * i] = cosf(theta);
    cs[2 * i + 1] = sinf(theta);
  }
  __syncthreads();
  const float* src = qkv + static_cast<size_t>(r) * (qw + 2 * kvw);
  float* qr = q + static_cast<size_t>(r) * qw;
  __half* kr = k + static_cast<size_t>(r) * kvw;
  __half* vr = v + static_cast<size_t>(r) * kvw;
  // Q and K are head-aligned and contiguous in src, so element e is pair (e % head_dim) / 2.
  for (int p = threadIdx.x; p < (qw + kvw) / 2; p += blockDim.x) {
    const int e = 2 * p, i = (e % head_dim) / 2;
    float x0 = src[e], x1 = src[e + 1];
    rope_rotate(x0, x1, cs[2 * i], cs[2 * i + 1]);
    if (e < qw) {
      qr[e] = x0;
      qr[e + 1] = x1;
    } else {
      kr[e - qw] = __float2half_rn(x0);
      kr[e - qw + 1] = __float2half_rn(x1);
    }
  }
  for (int j = threadIdx.x; j < kvw; j += blockDim.x) vr[j] = __float2half_rn(src[qw + kvw + j]);
}

// gate_up: [rows][2*ff]; h: [rows][ff]
__global__ void swiglu_kernel(const float* __restrict__ gate_up, __half* __restrict__ h, int ff,
                              size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / ff, j = i % ff;
    const float* g = gate_up + r * 2 * ff;
    h[i] = __float2half_rn(swiglu_one(g[j], g[ff + j]));
  }
}

}  // namespace fd::kernels::cuda
