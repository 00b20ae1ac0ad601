// Scalar formulas shared by the CPU kernels (kernels/ops.cc) and the CUDA kernels
// (kernels/cuda/), so both backends compute the same thing element by element.
#pragma once
#include <math.h>

#ifdef __CUDACC__
#define FD_HOST_DEVICE __host__ __device__
#else
#define FD_HOST_DEVICE
#endif

namespace fd::kernels {

// RMSNorm multiplies a row by this; mean_sq is the mean of the row's squares.
FD_HOST_DEVICE inline float rmsnorm_scale(float mean_sq, float eps) {
  return 1.0f / sqrtf(mean_sq + eps);
}

// llama.cpp RoPE: pair i of a head turns by pos * theta_scale^i radians.
FD_HOST_DEVICE inline float rope_theta_scale(float base, int head_dim) {
  return powf(base, -2.0f / static_cast<float>(head_dim));
}

// The angle of pair i, built like llama.cpp by i repeated fp32 multiplications (not powf), so
// that a loop carrying theta *= theta_scale from pair to pair gives the same bits.
FD_HOST_DEVICE inline float rope_theta(int pos, float theta_scale, int i) {
  float theta = static_cast<float>(pos);
  for (int j = 0; j < i; ++j) theta *= theta_scale;
  return theta;
}

// Rotates the pair (x0, x1) by the angle whose cosine and sine are c and s.
FD_HOST_DEVICE inline void rope_rotate(float& x0, float& x1, float c, float s) {
  const float a = x0, b = x1;
  x0 = a * c - b * s;
  x1 = a * s + b * c;
}

FD_HOST_DEVICE inline float silu(float x) { return x / (1.0f + expf(-x)); }

// The SwiGLU gate of one MLP unit: silu(gate) * up.
FD_HOST_DEVICE inline float swiglu_one(float gate, float up) { return silu(gate) * up; }

}  // namespace fd::kernels
