// A plain, single-threaded, scalar fp32 llama forward pass, written independently of kernels/
// and the S-part backends: the reference the backend and end-to-end tests compare against.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "runtime/model.h"

// Scalar helpers of the reference, also used by tests that stand in for the R-part.
namespace ref {

// x rounded to the nearest IEEE binary16 value (ties to even), returned as float.
float round_to_f16(float x);
// The float value of an IEEE binary16 bit pattern.
float f16_bits_to_float(uint16_t h);

// Causal softmax attention of one query row against the first n_keys cached keys.
// q, out: [n_heads][head_dim]; k, v: [n_keys][n_kv_heads][head_dim]. Scale 1/sqrt(head_dim).
void attention(const float* q, const float* k, const float* v, int n_keys, int n_heads,
               int n_kv_heads, int head_dim, float* out);

}  // namespace ref

class ReferenceModel {
 public:
  // round_kv_to_f16: store K/V rounded to fp16, as the R-workers do.
  explicit ReferenceModel(const fd::Model& model, bool round_kv_to_f16 = true);
  // Feeds the next token of sequence seq; returns the logits [vocab] for the token after it.
  std::vector<float> forward(int seq, int32_t token);
  // Forgets sequence seq.
  void reset(int seq);
  // Tokens fed to seq so far.
  int length(int seq) const;
  // The K (RoPE applied) and V of seq at layer, as stored: [length][n_kv_heads*head_dim].
  const std::vector<float>& cached_k(int seq, int layer) const;
  const std::vector<float>& cached_v(int seq, int layer) const;
  const fd::Model& model() const { return m_; }

 private:
  struct Cache {
    int len = 0;
    std::vector<std::vector<float>> k;  // [n_layers][len][kv_width]
    std::vector<std::vector<float>> v;  // [n_layers][len][kv_width]
  };
  const fd::Model& m_;
  bool round_kv_;
  std::map<int, Cache> seqs_;
};

// Feeds prompt to sequence 0 (after resetting it), then picks the argmax (lowest index on ties)
// n times, stopping early once eos is picked; returns the picked tokens without eos.
std::vector<int32_t> greedy_generate(ReferenceModel& model, std::vector<int32_t> prompt, int n,
                                     int eos);
