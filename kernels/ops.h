// Dense S-part kernels on the CPU. Row-major fp32 unless noted; fp16 values travel as IEEE
// binary16 bit patterns in uint16_t.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fd::kernels {

// y[m][n] = x[m][k] · w[n][k]ᵀ (BLAS sgemm). threads <= 0 keeps the library's setting.
void matmul_nt(const float* x, const float* w, float* y, int m, int n, int k);
void set_gemm_threads(int threads);

// y[r] = x[r] / rms(x[r]) * w, for rows r < rows; x, y: [rows][dim]; y may alias x.
void rmsnorm(const float* x, const float* w, float* y, int rows, int dim, float eps);

// llama.cpp "normal" RoPE: rotates adjacent pairs (x[2i], x[2i+1]) of every head by
// pos * base^(-2i/head_dim). x: [rows][n_heads][head_dim]; pos: [rows].
void rope(float* x, const int32_t* pos, int rows, int n_heads, int head_dim, float base);

// out[i] = silu(gate[i]) * up[i]; out may alias gate.
void swiglu(const float* gate, const float* up, float* out, size_t n);

// y[i] += x[i]
void add_inplace(float* y, const float* x, size_t n);

// Round-to-nearest-even conversions.
void f32_to_f16(const float* x, uint16_t* y, size_t n);
void f16_to_f32(const uint16_t* x, float* y, size_t n);

}  // namespace fd::kernels
