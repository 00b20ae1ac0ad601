// Model shapes, prompts and shared-file paths the tests have in common.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <algorithm>
#include <cmath>

#include "runtime/model.h"
#include "runtime/spart.h"

namespace test_models {

// A llama shape with head_dim = dim / n_heads.
inline fd::ModelConfig config(int n_layers, int dim, int n_heads, int n_kv_heads, int ff, int vocab,
                              int ctx) {
  fd::ModelConfig c;
  c.n_layers = n_layers;
  c.dim = dim;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = dim / n_heads;
  c.ff = ff;
  c.vocab = vocab;
  c.ctx = ctx;
  return c;
}

// One prompt per length, tokens uniform in [3, vocab) (0-2 are unk/bos/eos in the test models).
inline std::vector<std::vector<int32_t>> random_prompts(const std::vector<int>& lengths, int vocab,
                                                        uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
  std::vector<std::vector<int32_t>> out;
  for (int n : lengths) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t& t : p) t = tok(rng);
    out.push_back(p);
  }
  return out;
}

// The step that feeds feed[s] to sequence s at positions len[s], len[s]+1, ... (then advances
// len[s]), with the logits of each sequence's last row. row_seq: [rows] the sequence of each row.
inline fd::StepInput feed_step(const std::vector<std::vector<int32_t>>& feed, std::vector<int>& len,
                               std::vector<int>& row_seq) {
  fd::StepInput in;
  row_seq.clear();
  for (size_t s = 0; s < feed.size(); ++s) {
    for (size_t i = 0; i < feed[s].size(); ++i) {
      in.tokens.push_back(feed[s][i]);
      in.pos.push_back(len[s] + static_cast<int>(i));
      row_seq.push_back(static_cast<int>(s));
    }
    in.logit_rows.push_back(static_cast<int32_t>(in.tokens.size()) - 1);
    len[s] += static_cast<int>(feed[s].size());
  }
  return in;
}

// The first index of the largest logit.
inline int first_argmax(const float* l, int n) { return static_cast<int>(std::max_element(l, l + n) - l); }

// Gap between the largest and second largest logit.
inline float top2_gap(const float* l, int n) {
  float a = -INFINITY, b = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (l[i] > a) {
      b = a;
      a = l[i];
    } else if (l[i] > b) {
      b = l[i];
    }
  }
  return a - b;
}

inline std::string stories_path() { return std::string(FD_SHARED_DIR) + "/models/stories260K.gguf"; }

}  // namespace test_models
