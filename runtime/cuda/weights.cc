#include "runtime/cuda/weights.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/launch.h"
#include "runtime/error.h"

namespace fd::cuda {
namespace {

// fp32 values converted per trip through the staging buffer (64 MiB).
constexpr size_t kStagingFloats = size_t{16} << 20;

void expect_size(const std::vector<float>& t, size_t n, const std::string& what) {
  if (t.size() != n) {
    throw Error("The model's " + what + " holds " + std::to_string(t.size()) +
                " values where its configuration implies " + std::to_string(n) + ".");
  }
}

class Uploader {
 public:
  explicit Uploader(int device) : device_(device) {}

  // dst[0, src.size()) = fp16(src), through the fp32 staging buffer on the legacy default stream,
  // whose cudaMemcpy waits for the previous conversion before overwriting the staging buffer.
  void f16(const std::vector<float>& src, uint16_t* dst) {
    if (staging_.size() == 0) staging_.reset(kStagingFloats, device_);
    for (size_t off = 0; off < src.size(); off += kStagingFloats) {
      const size_t n = std::min(kStagingFloats, src.size() - off);
      FD_CUDA_CHECK(cudaMemcpy(staging_.get(), src.data() + off, n * sizeof(float),
                               cudaMemcpyHostToDevice),
                    device_);
      FD_CUDA_CHECK(kernels::cuda::f32_to_f16(staging_.get(), dst + off, n, nullptr), device_);
    }
  }

  void matrix(const std::vector<float>& src, DeviceArray<uint16_t>& dst) {
    dst.reset(src.size(), device_);
    f16(src, dst.get());
  }

  // Stacks a over b ([rows_a + rows_b][cols]) in one fp16 matrix.
  void stacked(const std::vector<float>& a, const std::vector<float>& b, DeviceArray<uint16_t>& dst) {
    dst.reset(a.size() + b.size(), device_);
    f16(a, dst.get());
    f16(b, dst.get() + a.size());
  }

  void f32(const std::vector<float>& src, DeviceArray<float>& dst) {
    dst.reset(src.size(), device_);
    FD_CUDA_CHECK(cudaMemcpy(dst.get(), src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice),
                  device_);
  }

  void finish() {
    FD_CUDA_CHECK(cudaDeviceSynchronize(), device_);
    staging_.reset(0, device_);
  }

 private:
  int device_;
  DeviceArray<float> staging_;  // [kStagingFloats]
};

void check_sizes(const Model& m) {
  const ModelConfig& c = m.cfg;
  if (c.n_layers <= 0 || c.dim <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.head_dim % 2 != 0 || c.ff <= 0 || c.vocab <= 0) {
    throw Error("The model's configuration is not a valid llama configuration for the CUDA backend.");
  }
  const size_t dim = c.dim, q = c.q_width(), kv = c.kv_width(), ff = c.ff, vocab = c.vocab;
  expect_size(m.tok_embd, vocab * dim, "token embedding");
  expect_size(m.output, vocab * dim, "output matrix");
  expect_size(m.out_norm, dim, "output norm");
  if (m.layers.size() != static_cast<size_t>(c.n_layers)) {
    throw Error("The model holds " + std::to_string(m.layers.size()) + " layers where its configuration says " +
                std::to_string(c.n_layers) + ".");
  }
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerWeights& l = m.layers[i];
    const std::string at = " of layer " + std::to_string(i);
    expect_size(l.attn_norm, dim, "attention norm" + at);
    expect_size(l.wq, q * dim, "wq" + at);
    expect_size(l.wk, kv * dim, "wk" + at);
    expect_size(l.wv, kv * dim, "wv" + at);
    expect_size(l.wo, dim * q, "wo" + at);
    expect_size(l.ffn_norm, dim, "MLP norm" + at);
    expect_size(l.w_gate, ff * dim, "w_gate" + at);
    expect_size(l.w_up, ff * dim, "w_up" + at);
    expect_size(l.w_down, dim * ff, "w_down" + at);
  }
}

}  // namespace

void upload_model(const Model& m, int device, DeviceModel& out) {
  check_sizes(m);
  Uploader up(device);
  up.matrix(m.tok_embd, out.tok_embd);
  if (m.output == m.tok_embd) {
    out.output = out.tok_embd.get();
  } else {
    up.matrix(m.output, out.own_output);
    out.output = out.own_output.get();
  }
  up.f32(m.out_norm, out.out_norm);
  out.layers = std::vector<DeviceLayer>(m.layers.size());
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerWeights& l = m.layers[i];
    DeviceLayer& d = out.layers[i];
    up.f32(l.attn_norm, d.attn_norm);
    d.wqkv.reset(l.wq.size() + l.wk.size() + l.wv.size(), device);
    up.f16(l.wq, d.wqkv.get());
    up.f16(l.wk, d.wqkv.get() + l.wq.size());
    up.f16(l.wv, d.wqkv.get() + l.wq.size() + l.wk.size());
    up.matrix(l.wo, d.wo);
    up.f32(l.ffn_norm, d.ffn_norm);
    up.stacked(l.w_gate, l.w_up, d.w_gate_up);
    up.matrix(l.w_down, d.w_down);
  }
  up.finish();
}

}  // namespace fd::cuda
