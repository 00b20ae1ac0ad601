// A llama-architecture model held in fp32 host memory, whatever its on-disk dtype.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tokenizer.h"

namespace fd {

struct ModelConfig {
  int n_layers = 0;
  int dim = 0;         // embedding width
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (GQA when < n_heads)
  int head_dim = 0;    // dim / n_heads
  int ff = 0;          // MLP hidden width
  int vocab = 0;
  int ctx = 0;         // maximum sequence length (prompt + generated)
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
  int q_width() const { return n_heads * head_dim; }
  int kv_width() const { return n_kv_heads * head_dim; }
};

// Weight matrices are row-major [out][in], as GGUF stores them (ne0 = in).
struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  std::vector<float> wq;         // [n_heads*head_dim][dim]
  std::vector<float> wk;         // [n_kv_heads*head_dim][dim]
  std::vector<float> wv;         // [n_kv_heads*head_dim][dim]
  std::vector<float> wo;         // [dim][n_heads*head_dim]
  std::vector<float> ffn_norm;   // [dim]
  std::vector<float> w_gate;     // [ff][dim]
  std::vector<float> w_up;       // [ff][dim]
  std::vector<float> w_down;     // [dim][ff]
};

struct Model {
  ModelConfig cfg;
  std::string name;                  // general.name or a label such as "synthetic"
  std::vector<float> tok_embd;       // [vocab][dim]
  std::vector<LayerWeights> layers;  // [n_layers]
  std::vector<float> out_norm;       // [dim]
  std::vector<float> output;         // [vocab][dim]; a copy of tok_embd when tied
  Vocab vocab;
};

// Bytes of the fp32 weights of a model of this shape, the output matrix counted even when tied
// (it is then a copy).
double model_bytes(const ModelConfig& cfg);
// Throws fd::Error("WHAT: ...") when those bytes exceed `available` (available_memory() when 0; no
// check when that is unknown). Without it, a model too big ends in the kernel's OOM killer halfway
// through loading, or in a bare std::bad_alloc.
void check_model_memory(const ModelConfig& cfg, const std::string& what, size_t available = 0);

// Loads a GGUF llama model. Throws fd::Error("PATH: problem") on any malformed input.
Model load_model(const std::string& path);

// Deterministic random weights (uniform, scaled by 1/sqrt(fan_in)) and a synthetic vocabulary.
Model make_random_model(const ModelConfig& cfg, uint64_t seed);

}  // namespace fd
