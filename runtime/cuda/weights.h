// A model's weights in GPU memory: matrices in fp16, norm weights in fp32 (tiny, and the norms
// compute in fp32 anyway). Matrices read by the same input are stacked so one GEMM does them.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/cuda/buffers.h"
#include "runtime/model.h"

namespace fd::cuda {

struct DeviceLayer {
  DeviceArray<float> attn_norm;     // [dim]
  DeviceArray<uint16_t> wqkv;       // [n_heads*head_dim + 2*n_kv_heads*head_dim][dim]: wq, wk, wv
  DeviceArray<uint16_t> wo;         // [dim][n_heads*head_dim]
  DeviceArray<float> ffn_norm;      // [dim]
  DeviceArray<uint16_t> w_gate_up;  // [2*ff][dim]: w_gate, then w_up
  DeviceArray<uint16_t> w_down;     // [dim][ff]
};

struct DeviceModel {
  DeviceArray<uint16_t> tok_embd;     // [vocab][dim]
  DeviceArray<uint16_t> own_output;   // [vocab][dim]; empty when the LM head is tied to tok_embd
  const uint16_t* output = nullptr;   // [vocab][dim]: own_output or tok_embd
  DeviceArray<float> out_norm;        // [dim]
  std::vector<DeviceLayer> layers;    // [n_layers]
};

// Checks that every tensor of m has the size its config implies, then uploads it to device
// (which must be current). Throws fd::Error on a malformed model or a CUDA failure.
void upload_model(const Model& m, int device, DeviceModel& out);

}  // namespace fd::cuda
