// Launchers of the CUDA kernels of the S-part (kernels/cuda/ops.cuh). Host code includes only
// this header. Row-major; fp16 values travel as IEEE binary16 bit patterns in uint16_t, as on
// the CPU. Every launcher enqueues on `stream`, does nothing when there is no work, and returns
// the launch status.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace fd::kernels::cuda {

// y[i] = fp16(x[i]), round to nearest even. x: [n]; y: [n].
cudaError_t f32_to_f16(const float* x, uint16_t* y, size_t n, cudaStream_t stream);

// x[r] = table[tokens[r]] widened to fp32. tokens: [rows]; table: [vocab][dim] fp16; x: [rows][dim].
cudaError_t embed(const int32_t* tokens, const uint16_t* table, float* x, int rows, int dim,
                  cudaStream_t stream);

// y[r] = fp16(x[src] / rms(x[src]) * w) with src = row_idx ? row_idx[r] : r.
// x: [*][dim] fp32; row_idx: [rows] or null; w: [dim] fp32; y: [rows][dim] fp16.
cudaError_t rmsnorm(const float* x, const int32_t* row_idx, const float* w, uint16_t* y, int rows,
                    int dim, float eps, cudaStream_t stream);

// Splits the fused QKV projection and applies RoPE to Q and K (kernels::rope's formula).
// qkv: [rows][(n_heads + 2*n_kv_heads)*head_dim] fp32 (Q, then K, then V of each row);
// pos: [rows]; q: [rows][n_heads*head_dim] fp32; k, v: [rows][n_kv_heads*head_dim] fp16.
cudaError_t qkv_rope(const float* qkv, const int32_t* pos, int rows, int n_heads, int n_kv_heads,
                     int head_dim, float theta_scale, float* q, uint16_t* k, uint16_t* v,
                     cudaStream_t stream);

// h[r][j] = fp16(silu(gate_up[r][j]) * gate_up[r][ff + j]).
// gate_up: [rows][2*ff] fp32 (gate, then up); h: [rows][ff] fp16.
cudaError_t swiglu(const float* gate_up, uint16_t* h, int rows, int ff, cudaStream_t stream);

}  // namespace fd::kernels::cuda
