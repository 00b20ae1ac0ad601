#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/error.h"
#include "runtime/spart.h"

namespace fd {
namespace {

// Buffers keep their capacity across steps; resize() only grows them when a step has more rows.
class CpuState : public SPartState {
 public:
  int rows = 0;
  std::vector<int32_t> pos;         // [rows]
  std::vector<int32_t> logit_rows;  // [n_logit_rows]
  std::vector<float> x;             // [rows][dim] residual stream
  std::vector<float> xb;            // [rows][dim] normed input / matmul output
  std::vector<float> k;             // [rows][kv_width]
  std::vector<float> v;             // [rows][kv_width]
  std::vector<float> hb;            // [rows][ff]
  std::vector<float> hb2;           // [rows][ff]
};

class CpuBackend : public SPartBackend {
 public:
  explicit CpuBackend(const Model& model) : m_(model), c_(model.cfg) {}

  const ModelConfig& config() const override { return c_; }
  const char* name() const override { return "cpu"; }
  std::unique_ptr<SPartState> make_state() const override { return std::make_unique<CpuState>(); }

  void embed(SPartState& state, const StepInput& in) const override {
    CpuState& s = cast(state);
    begin_step(s, in);
    const size_t dim = static_cast<size_t>(c_.dim);
    for (size_t r = 0; r < static_cast<size_t>(s.rows); ++r) {
      const float* e = m_.tok_embd.data() + static_cast<size_t>(in.tokens[r]) * dim;
      std::copy(e, e + dim, s.x.data() + r * dim);
    }
  }

  void get_x(const SPartState& state, std::vector<float>& x) const override {
    const auto* s = dynamic_cast<const CpuState*>(&state);
    if (s == nullptr) throw Error("The CPU backend was given a state made by another backend.");
    x.assign(s->x.data(), s->x.data() + static_cast<size_t>(s->rows) * c_.dim);
  }

  void set_x(SPartState& state, const StepInput& in, const float* x) const override {
    CpuState& s = cast(state);
    begin_step(s, in);
    std::copy(x, x + static_cast<size_t>(s.rows) * c_.dim, s.x.data());
  }

  void attn_in(SPartState& state, int layer, AttnIn& out) const override {
    CpuState& s = cast(state);
    const LayerWeights& w = weights(layer);
    const int rows = s.rows;
    const size_t kv_n = static_cast<size_t>(rows) * c_.kv_width();
    kernels::rmsnorm(s.x.data(), w.attn_norm.data(), s.xb.data(), rows, c_.dim, c_.rms_eps);
    out.q.resize(static_cast<size_t>(rows) * c_.q_width());
    kernels::matmul_nt(s.xb.data(), w.wq.data(), out.q.data(), rows, c_.q_width(), c_.dim);
    kernels::matmul_nt(s.xb.data(), w.wk.data(), s.k.data(), rows, c_.kv_width(), c_.dim);
    kernels::matmul_nt(s.xb.data(), w.wv.data(), s.v.data(), rows, c_.kv_width(), c_.dim);
    kernels::rope(out.q.data(), s.pos.data(), rows, c_.n_heads, c_.head_dim, c_.rope_base);
    kernels::rope(s.k.data(), s.pos.data(), rows, c_.n_kv_heads, c_.head_dim, c_.rope_base);
    out.k.resize(kv_n);
    out.v.resize(kv_n);
    kernels::f32_to_f16(s.k.data(), out.k.data(), kv_n);
    kernels::f32_to_f16(s.v.data(), out.v.data(), kv_n);
  }

  void attn_out(SPartState& state, int layer, const float* o) const override {
    CpuState& s = cast(state);
    const LayerWeights& w = weights(layer);
    const int rows = s.rows;
    const size_t n_x = static_cast<size_t>(rows) * c_.dim;
    const size_t n_h = static_cast<size_t>(rows) * c_.ff;
    kernels::matmul_nt(o, w.wo.data(), s.xb.data(), rows, c_.dim, c_.q_width());
    kernels::add_inplace(s.x.data(), s.xb.data(), n_x);
    kernels::rmsnorm(s.x.data(), w.ffn_norm.data(), s.xb.data(), rows, c_.dim, c_.rms_eps);
    kernels::matmul_nt(s.xb.data(), w.w_gate.data(), s.hb.data(), rows, c_.ff, c_.dim);
    kernels::matmul_nt(s.xb.data(), w.w_up.data(), s.hb2.data(), rows, c_.ff, c_.dim);
    kernels::swiglu(s.hb.data(), s.hb2.data(), s.hb.data(), n_h);
    kernels::matmul_nt(s.hb.data(), w.w_down.data(), s.xb.data(), rows, c_.dim, c_.ff);
    kernels::add_inplace(s.x.data(), s.xb.data(), n_x);
  }

  void logits(SPartState& state, std::vector<float>& out) const override {
    CpuState& s = cast(state);
    const int n = static_cast<int>(s.logit_rows.size());
    const size_t dim = static_cast<size_t>(c_.dim);
    if (s.xb.size() < static_cast<size_t>(n) * dim) s.xb.resize(static_cast<size_t>(n) * dim);
    for (int i = 0; i < n; ++i) {
      const float* src = s.x.data() + static_cast<size_t>(s.logit_rows[i]) * dim;
      std::copy(src, src + dim, s.xb.data() + static_cast<size_t>(i) * dim);
    }
    kernels::rmsnorm(s.xb.data(), m_.out_norm.data(), s.xb.data(), n, c_.dim, c_.rms_eps);
    out.resize(static_cast<size_t>(n) * c_.vocab);
    if (n > 0) kernels::matmul_nt(s.xb.data(), m_.output.data(), out.data(), n, c_.vocab, c_.dim);
  }

 private:
  static CpuState& cast(SPartState& state) {
    auto* s = dynamic_cast<CpuState*>(&state);
    if (s == nullptr) throw Error("The CPU backend was given a state made by another backend.");
    return *s;
  }

  // Checks a step's tokens, positions and logit rows and sizes the buffers for its rows.
  void begin_step(CpuState& s, const StepInput& in) const {
    const int rows = static_cast<int>(in.tokens.size());
    check_step(c_, in);
    s.rows = rows;
    s.pos = in.pos;
    s.logit_rows = in.logit_rows;
    const size_t n = static_cast<size_t>(rows);
    const size_t dim = static_cast<size_t>(c_.dim);
    s.x.resize(n * dim);
    s.xb.resize(n * dim);
    s.k.resize(n * c_.kv_width());
    s.v.resize(n * c_.kv_width());
    s.hb.resize(n * c_.ff);
    s.hb2.resize(n * c_.ff);
  }

  const LayerWeights& weights(int layer) const {
    if (layer < 0 || layer >= c_.n_layers) {
      throw Error("Layer " + std::to_string(layer) + " does not exist; the model has " +
                  std::to_string(c_.n_layers) + " layers.");
    }
    return m_.layers[static_cast<size_t>(layer)];
  }

  const Model& m_;
  const ModelConfig& c_;
};

}  // namespace

std::unique_ptr<SPartBackend> make_cpu_backend(const Model& model) {
  return std::make_unique<CpuBackend>(model);
}

}  // namespace fd
