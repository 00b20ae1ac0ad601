#include "runtime/parallel.h"

#include <algorithm>
#include <string>
#include <utility>

#include "kernels/ops.h"
#include "runtime/error.h"

namespace fd {
namespace {

// Rows [row0, row0+n) of a row-major [rows][cols] matrix.
std::vector<float> take_rows(const std::vector<float>& w, int cols, int row0, int n) {
  const auto* first = w.data() + static_cast<size_t>(row0) * cols;
  return std::vector<float>(first, first + static_cast<size_t>(n) * cols);
}

// Columns [col0, col0+n) of a row-major [rows][cols] matrix, as [rows][n].
std::vector<float> take_cols(const std::vector<float>& w, int rows, int cols, int col0, int n) {
  std::vector<float> out(static_cast<size_t>(rows) * n);
  for (int r = 0; r < rows; ++r) {
    const float* src = w.data() + static_cast<size_t>(r) * cols + col0;
    std::copy(src, src + n, out.data() + static_cast<size_t>(r) * n);
  }
  return out;
}

void check_group(int index, int size, const char* what) {
  if (size < 1) {
    throw Error(std::string("A ") + what + " group needs at least one member, got " +
                std::to_string(size) + ".");
  }
  if (index < 0 || index >= size) {
    throw Error(std::string("There is no ") + what + " " + std::to_string(index) + " in a group of " +
                std::to_string(size) + ".");
  }
}

}  // namespace

TpSlice tp_slice(const ModelConfig& cfg, int rank, int size) {
  check_group(rank, size, "tensor-parallel rank");
  if (cfg.n_heads % size != 0 || cfg.n_kv_heads % size != 0) {
    throw Error("Tensor parallelism over " + std::to_string(size) + " ranks needs a head count (" +
                std::to_string(cfg.n_heads) + ") and a KV head count (" +
                std::to_string(cfg.n_kv_heads) + ") both divisible by " + std::to_string(size) +
                ".");
  }
  if (cfg.ff < size) {
    throw Error("Tensor parallelism over " + std::to_string(size) + " ranks needs an MLP width of " +
                "at least " + std::to_string(size) + ", got " + std::to_string(cfg.ff) + ".");
  }
  TpSlice s;
  s.rank = rank;
  s.size = size;
  s.heads = cfg.n_heads / size;
  s.head0 = rank * s.heads;
  s.kv_heads = cfg.n_kv_heads / size;
  s.kv_head0 = rank * s.kv_heads;
  const int base = cfg.ff / size, extra = cfg.ff % size;
  s.ff = base + (rank < extra ? 1 : 0);
  s.ff0 = rank * base + std::min(rank, extra);
  return s;
}

PpStage pp_stage(const ModelConfig& cfg, int stage, int size) {
  check_group(stage, size, "pipeline stage");
  if (size > cfg.n_layers) {
    throw Error("A pipeline of " + std::to_string(size) + " stages needs at least as many layers, " +
                "but the model has " + std::to_string(cfg.n_layers) + ".");
  }
  const int base = cfg.n_layers / size, extra = cfg.n_layers % size;
  PpStage st;
  st.stage = stage;
  st.size = size;
  st.layers = base + (stage < extra ? 1 : 0);
  st.layer0 = stage * base + std::min(stage, extra);
  return st;
}

Model pp_model(const Model& model, const PpStage& st) {
  const PpStage want = pp_stage(model.cfg, st.stage, st.size);
  if (want.layer0 != st.layer0 || want.layers != st.layers) {
    throw Error("Pipeline stage " + std::to_string(st.stage) + " of " + std::to_string(st.size) +
                " does not match this model's " + std::to_string(model.cfg.n_layers) + " layers.");
  }
  if (static_cast<int>(model.layers.size()) != model.cfg.n_layers) {
    throw Error("The model holds " + std::to_string(model.layers.size()) + " layers but declares " +
                std::to_string(model.cfg.n_layers) + ".");
  }
  Model m;
  m.cfg = model.cfg;
  m.cfg.n_layers = st.layers;
  m.name = model.name;
  m.tok_embd = model.tok_embd;
  m.layers.assign(model.layers.begin() + st.layer0, model.layers.begin() + st.layer0 + st.layers);
  m.out_norm = model.out_norm;
  m.output = model.output;
  m.vocab = model.vocab;
  return m;
}

TpRankBackend::TpRankBackend(const Model& model, const TpSlice& slice)
    : cfg_(model.cfg), slice_(slice) {
  const TpSlice want = tp_slice(cfg_, slice.rank, slice.size);
  if (want.head0 != slice.head0 || want.heads != slice.heads || want.kv_head0 != slice.kv_head0 ||
      want.kv_heads != slice.kv_heads || want.ff0 != slice.ff0 || want.ff != slice.ff) {
    throw Error("Tensor-parallel rank " + std::to_string(slice.rank) + " of " +
                std::to_string(slice.size) + " was given a slice other than tp_slice's.");
  }
  if (static_cast<int>(model.layers.size()) != cfg_.n_layers) {
    throw Error("The model holds " + std::to_string(model.layers.size()) + " layers but declares " +
                std::to_string(cfg_.n_layers) + ".");
  }
  const int dim = cfg_.dim, hd = cfg_.head_dim;
  tok_embd_ = model.tok_embd;
  out_norm_ = model.out_norm;
  output_ = model.output;
  layers_.reserve(model.layers.size());
  for (const LayerWeights& w : model.layers) {
    Layer l;
    l.attn_norm = w.attn_norm;
    l.wq = take_rows(w.wq, dim, slice.head0 * hd, slice.heads * hd);
    l.wk = take_rows(w.wk, dim, slice.kv_head0 * hd, slice.kv_heads * hd);
    l.wv = take_rows(w.wv, dim, slice.kv_head0 * hd, slice.kv_heads * hd);
    l.wo = take_cols(w.wo, dim, cfg_.q_width(), slice.head0 * hd, slice.heads * hd);
    l.ffn_norm = w.ffn_norm;
    l.w_gate = take_rows(w.w_gate, dim, slice.ff0, slice.ff);
    l.w_up = take_rows(w.w_up, dim, slice.ff0, slice.ff);
    l.w_down = take_cols(w.w_down, dim, cfg_.ff, slice.ff0, slice.ff);
    layers_.push_back(std::move(l));
  }
}

const TpRankBackend::Layer& TpRankBackend::layer(int l) const {
  if (l < 0 || l >= cfg_.n_layers) {
    throw Error("Layer " + std::to_string(l) + " does not exist; the model has " +
                std::to_string(cfg_.n_layers) + " layers.");
  }
  return layers_[static_cast<size_t>(l)];
}

void TpRankBackend::embed(TpRankState& s, const StepInput& in) const {
  const int rows = static_cast<int>(in.tokens.size());
  check_step(cfg_, in);
  s.rows = rows;
  s.pos = in.pos;
  s.logit_rows = in.logit_rows;
  const size_t n = static_cast<size_t>(rows), dim = static_cast<size_t>(cfg_.dim);
  s.x.resize(n * dim);
  s.xb.resize(n * dim);
  s.k.resize(n * kv_width());
  s.v.resize(n * kv_width());
  s.hb.resize(n * slice_.ff);
  s.hb2.resize(n * slice_.ff);
  for (size_t r = 0; r < n; ++r) {
    const float* e = tok_embd_.data() + static_cast<size_t>(in.tokens[r]) * dim;
    std::copy(e, e + dim, s.x.data() + r * dim);
  }
}

void TpRankBackend::attn_in(TpRankState& s, int l, AttnIn& out) const {
  const Layer& w = layer(l);
  const int rows = s.rows, hd = cfg_.head_dim;
  const size_t kv_n = static_cast<size_t>(rows) * kv_width();
  kernels::rmsnorm(s.x.data(), w.attn_norm.data(), s.xb.data(), rows, cfg_.dim, cfg_.rms_eps);
  out.q.resize(static_cast<size_t>(rows) * q_width());
  kernels::matmul_nt(s.xb.data(), w.wq.data(), out.q.data(), rows, q_width(), cfg_.dim);
  kernels::matmul_nt(s.xb.data(), w.wk.data(), s.k.data(), rows, kv_width(), cfg_.dim);
  kernels::matmul_nt(s.xb.data(), w.wv.data(), s.v.data(), rows, kv_width(), cfg_.dim);
  // RoPE depends on the position within a head only, so slices rotate like the whole.
  kernels::rope(out.q.data(), s.pos.data(), rows, slice_.heads, hd, cfg_.rope_base);
  kernels::rope(s.k.data(), s.pos.data(), rows, slice_.kv_heads, hd, cfg_.rope_base);
  out.k.resize(kv_n);
  out.v.resize(kv_n);
  kernels::f32_to_f16(s.k.data(), out.k.data(), kv_n);
  kernels::f32_to_f16(s.v.data(), out.v.data(), kv_n);
}

void TpRankBackend::attn_proj(TpRankState& s, int l, const float* o,
                              std::vector<float>& partial) const {
  const Layer& w = layer(l);
  partial.resize(static_cast<size_t>(s.rows) * cfg_.dim);
  kernels::matmul_nt(o, w.wo.data(), partial.data(), s.rows, cfg_.dim, q_width());
}

void TpRankBackend::add_residual(TpRankState& s, const float* sum) const {
  kernels::add_inplace(s.x.data(), sum, static_cast<size_t>(s.rows) * cfg_.dim);
}

void TpRankBackend::mlp(TpRankState& s, int l, std::vector<float>& partial) const {
  const Layer& w = layer(l);
  const int rows = s.rows;
  kernels::rmsnorm(s.x.data(), w.ffn_norm.data(), s.xb.data(), rows, cfg_.dim, cfg_.rms_eps);
  kernels::matmul_nt(s.xb.data(), w.w_gate.data(), s.hb.data(), rows, slice_.ff, cfg_.dim);
  kernels::matmul_nt(s.xb.data(), w.w_up.data(), s.hb2.data(), rows, slice_.ff, cfg_.dim);
  kernels::swiglu(s.hb.data(), s.hb2.data(), s.hb.data(), static_cast<size_t>(rows) * slice_.ff);
  partial.resize(static_cast<size_t>(rows) * cfg_.dim);
  kernels::matmul_nt(s.hb.data(), w.w_down.data(), partial.data(), rows, cfg_.dim, slice_.ff);
}

void TpRankBackend::logits(TpRankState& s, std::vector<float>& out) const {
  const int n = static_cast<int>(s.logit_rows.size());
  const size_t dim = static_cast<size_t>(cfg_.dim);
  if (s.xb.size() < static_cast<size_t>(n) * dim) s.xb.resize(static_cast<size_t>(n) * dim);
  for (int i = 0; i < n; ++i) {
    const float* src = s.x.data() + static_cast<size_t>(s.logit_rows[i]) * dim;
    std::copy(src, src + dim, s.xb.data() + static_cast<size_t>(i) * dim);
  }
  kernels::rmsnorm(s.xb.data(), out_norm_.data(), s.xb.data(), n, cfg_.dim, cfg_.rms_eps);
  out.resize(static_cast<size_t>(n) * cfg_.vocab);
  if (n > 0) kernels::matmul_nt(s.xb.data(), output_.data(), out.data(), n, cfg_.vocab, cfg_.dim);
}

}  // namespace fd
