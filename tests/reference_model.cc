#include "tests/reference_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

// Dot products accumulate in double so the reference is closer to exact than any fp32 kernel;
// values are stored in fp32 as the model defines them.
namespace {

// y[n] = w[n][k] · x[k]
void matvec(const std::vector<float>& w, const std::vector<float>& x, std::vector<float>& y, int n,
            int k) {
  y.assign(static_cast<size_t>(n), 0.0f);
  for (int i = 0; i < n; ++i) {
    const float* row = w.data() + static_cast<size_t>(i) * k;
    double acc = 0.0;
    for (int j = 0; j < k; ++j) acc += static_cast<double>(row[j]) * x[j];
    y[i] = static_cast<float>(acc);
  }
}

std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& w, float eps) {
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i] * scale * w[i]);
  return y;
}

// Rotates the adjacent pairs (x[2i], x[2i+1]) of each head by pos * base^(-2i/head_dim).
void rope(std::vector<float>& x, int n_heads, int head_dim, int pos, float base) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x.data() + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < head_dim / 2; ++i) {
      const double theta = pos * std::pow(static_cast<double>(base), -2.0 * i / head_dim);
      const double c = std::cos(theta), s = std::sin(theta);
      const double a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = static_cast<float>(a * c - b * s);
      v[2 * i + 1] = static_cast<float>(a * s + b * c);
    }
  }
}

}  // namespace

namespace ref {

float round_to_f16(float x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0f) return x;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = m * 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
  // binary16 keeps 10 bits after the leading one; below 2^-14 the spacing stays 2^-24.
  const int quantum = std::max(e - 1, -14) - 10;
  const double r = std::ldexp(std::nearbyint(std::ldexp(static_cast<double>(std::fabs(x)), -quantum)),
                              quantum);
  const double max_f16 = 65504.0;
  const float mag = r > max_f16 ? std::numeric_limits<float>::infinity() : static_cast<float>(r);
  return std::copysign(mag, x);
}

float f16_bits_to_float(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  }
  return static_cast<float>(sign ? -v : v);
}

void attention(const float* q, const float* k, const float* v, int n_keys, int n_heads,
               int n_kv_heads, int head_dim, float* out) {
  const int group = n_heads / n_kv_heads;
  const size_t kv_width = static_cast<size_t>(n_kv_heads) * head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<double> score(static_cast<size_t>(n_keys));
  for (int h = 0; h < n_heads; ++h) {
    const float* qh = q + static_cast<size_t>(h) * head_dim;
    const size_t kv_off = static_cast<size_t>(h / group) * head_dim;
    double top = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < n_keys; ++t) {
      const float* kt = k + t * kv_width + kv_off;
      double dot = 0.0;
      for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(qh[d]) * kt[d];
      score[t] = dot * scale;
      top = std::max(top, score[t]);
    }
    double total = 0.0;
    for (int t = 0; t < n_keys; ++t) {
      score[t] = std::exp(score[t] - top);
      total += score[t];
    }
    for (int d = 0; d < head_dim; ++d) {
      double acc = 0.0;
      for (int t = 0; t < n_keys; ++t) acc += score[t] * v[t * kv_width + kv_off + d];
      out[static_cast<size_t>(h) * head_dim + d] = static_cast<float>(acc / total);
    }
  }
}

}  // namespace ref

ReferenceModel::ReferenceModel(const fd::Model& model, bool round_kv_to_f16)
    : m_(model), round_kv_(round_kv_to_f16) {}

void ReferenceModel::reset(int seq) { seqs_.erase(seq); }

int ReferenceModel::length(int seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.len;
}

const std::vector<float>& ReferenceModel::cached_k(int seq, int layer) const {
  return seqs_.at(seq).k.at(static_cast<size_t>(layer));
}

const std::vector<float>& ReferenceModel::cached_v(int seq, int layer) const {
  return seqs_.at(seq).v.at(static_cast<size_t>(layer));
}

std::vector<float> ReferenceModel::forward(int seq, int32_t token) {
  const fd::ModelConfig& c = m_.cfg;
  if (token < 0 || token >= c.vocab) throw std::out_of_range("reference: token outside the vocabulary");
  Cache& cache = seqs_[seq];
  if (cache.k.empty()) {
    cache.k.resize(static_cast<size_t>(c.n_layers));
    cache.v.resize(static_cast<size_t>(c.n_layers));
  }
  const int pos = cache.len;
  const size_t dim = static_cast<size_t>(c.dim);

  std::vector<float> x(m_.tok_embd.begin() + token * dim, m_.tok_embd.begin() + (token + 1) * dim);
  std::vector<float> q, k, v, o(static_cast<size_t>(c.q_width())), proj, gate, up;
  for (int l = 0; l < c.n_layers; ++l) {
    const fd::LayerWeights& w = m_.layers[static_cast<size_t>(l)];
    std::vector<float> xb = rmsnorm(x, w.attn_norm, c.rms_eps);
    matvec(w.wq, xb, q, c.q_width(), c.dim);
    matvec(w.wk, xb, k, c.kv_width(), c.dim);
    matvec(w.wv, xb, v, c.kv_width(), c.dim);
    rope(q, c.n_heads, c.head_dim, pos, c.rope_base);
    rope(k, c.n_kv_heads, c.head_dim, pos, c.rope_base);
    if (round_kv_) {
      for (float& e : k) e = ref::round_to_f16(e);
      for (float& e : v) e = ref::round_to_f16(e);
    }
    std::vector<float>& kc = cache.k[static_cast<size_t>(l)];
    std::vector<float>& vc = cache.v[static_cast<size_t>(l)];
    kc.insert(kc.end(), k.begin(), k.end());
    vc.insert(vc.end(), v.begin(), v.end());
    ref::attention(q.data(), kc.data(), vc.data(), pos + 1, c.n_heads, c.n_kv_heads, c.head_dim,
                   o.data());
    matvec(w.wo, o, proj, c.dim, c.q_width());
    for (size_t i = 0; i < dim; ++i) x[i] += proj[i];

    xb = rmsnorm(x, w.ffn_norm, c.rms_eps);
    matvec(w.w_gate, xb, gate, c.ff, c.dim);
    matvec(w.w_up, xb, up, c.ff, c.dim);
    for (int i = 0; i < c.ff; ++i) {
      const double g = gate[i];
      gate[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
    }
    matvec(w.w_down, gate, proj, c.dim, c.ff);
    for (size_t i = 0; i < dim; ++i) x[i] += proj[i];
  }
  cache.len = pos + 1;
  std::vector<float> logits;
  matvec(m_.output, rmsnorm(x, m_.out_norm, c.rms_eps), logits, c.vocab, c.dim);
  return logits;
}

std::vector<int32_t> greedy_generate(ReferenceModel& model, std::vector<int32_t> prompt, int n,
                                     int eos) {
  std::vector<int32_t> out;
  if (prompt.empty() || n <= 0) return out;
  model.reset(0);
  std::vector<float> logits;
  for (int32_t t : prompt) logits = model.forward(0, t);
  for (int i = 0; i < n; ++i) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (next == eos) break;
    out.push_back(next);
    if (i + 1 < n) logits = model.forward(0, next);
  }
  return out;
}

