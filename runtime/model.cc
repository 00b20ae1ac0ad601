#include "runtime/model.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>

#include "runtime/error.h"
#include "runtime/gguf.h"
#include "runtime/host_memory.h"

namespace fd {
namespace {

constexpr int64_t kMaxDimension = int64_t{1} << 24;  // far above any real model; keeps products in range

int positive_int(const GgufFile& f, const std::string& key) {
  const int64_t v = f.get_int(key);
  if (v <= 0 || v > kMaxDimension) {
    throw Error(f.path() + ": metadata '" + key + "' must be a positive integer below 2^24, got " + std::to_string(v));
  }
  return static_cast<int>(v);
}

ModelConfig read_config(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama") {
    throw Error(f.path() + ": unsupported model architecture '" + arch + "' (only 'llama' is supported)");
  }
  ModelConfig c;
  c.n_layers = positive_int(f, "llama.block_count");
  c.dim = positive_int(f, "llama.embedding_length");
  c.n_heads = positive_int(f, "llama.attention.head_count");
  c.n_kv_heads = f.has("llama.attention.head_count_kv") ? positive_int(f, "llama.attention.head_count_kv") : c.n_heads;
  c.ff = positive_int(f, "llama.feed_forward_length");
  c.ctx = positive_int(f, "llama.context_length");
  if (c.dim % c.n_heads != 0) {
    throw Error(f.path() + ": embedding length " + std::to_string(c.dim) + " is not divisible by the head count " +
                std::to_string(c.n_heads));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    throw Error(f.path() + ": head count " + std::to_string(c.n_heads) + " is not a multiple of the KV head count " +
                std::to_string(c.n_kv_heads));
  }
  c.head_dim = c.dim / c.n_heads;
  const int64_t rope_dims = f.get_int("llama.rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim) {
    throw Error(f.path() + ": RoPE over " + std::to_string(rope_dims) + " of " + std::to_string(c.head_dim) +
                " head dimensions is not supported");
  }
  const double eps = f.get_float("llama.attention.layer_norm_rms_epsilon");
  if (!(eps > 0.0 && eps < 1.0)) {
    throw Error(f.path() + ": metadata 'llama.attention.layer_norm_rms_epsilon' must lie in (0, 1), got " +
                std::to_string(eps));
  }
  c.rms_eps = static_cast<float>(eps);
  const double base = f.get_float("llama.rope.freq_base", 10000.0);
  if (!(base > 1.0 && std::isfinite(base))) {
    throw Error(f.path() + ": metadata 'llama.rope.freq_base' must be a finite number above 1, got " +
                std::to_string(base));
  }
  c.rope_base = static_cast<float>(base);
  return c;
}

// Uniform random numbers from splitmix64; one independent stream per tensor.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // In [-1, 1), with 24 random bits.
  float symmetric() { return static_cast<float>(next() >> 40) * (1.0f / 8388608.0f) - 1.0f; }

 private:
  uint64_t state_;
};

std::vector<float> random_matrix(Rng rng, size_t rows, size_t fan_in) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(fan_in));
  std::vector<float> w(rows * fan_in);
  for (float& x : w) x = scale * rng.symmetric();
  return w;
}

std::vector<float> random_norm(Rng rng, size_t n) {
  std::vector<float> w(n);
  for (float& x : w) x = 1.0f + 0.05f * rng.symmetric();
  return w;
}

}  // namespace

double model_bytes(const ModelConfig& c) {
  const double dim = c.dim, q = c.q_width(), kv = c.kv_width(), ff = c.ff, vocab = c.vocab;
  const double layer = 2 * dim + dim * (q + 2 * kv) + q * dim + 3 * ff * dim;
  return 4.0 * (2 * vocab * dim + dim + c.n_layers * layer);
}

void check_model_memory(const ModelConfig& cfg, const std::string& what, size_t available) {
  if (available == 0) available = available_memory();
  const double need = model_bytes(cfg);
  if (available == 0 || need <= static_cast<double>(available)) return;
  throw Error(what + ": the model's weights take " + format_bytes(static_cast<size_t>(std::min(need, 1e18))) +
              " in memory as fp32, more than the " + format_bytes(available) +
              " this machine has available");
}

Model load_model(const std::string& path) {
  GgufFile f(path);
  Model m;
  m.cfg = read_config(f);
  ModelConfig& c = m.cfg;
  m.vocab = load_vocab(f);
  c.vocab = m.vocab.size();
  if (c.vocab <= 0) throw Error(path + ": the vocabulary is empty");
  if (f.has("llama.vocab_size") && f.get_int("llama.vocab_size") != c.vocab) {
    throw Error(path + ": metadata 'llama.vocab_size' is " + std::to_string(f.get_int("llama.vocab_size")) +
                " but the tokenizer has " + std::to_string(c.vocab) + " tokens");
  }
  m.name = f.has("general.name") ? f.get_string("general.name") : std::filesystem::path(path).stem().string();
  check_model_memory(c, path);

  const uint64_t dim = c.dim, q = c.q_width(), kv = c.kv_width(), ff = c.ff, vocab = c.vocab;
  m.tok_embd = f.read_f32("token_embd.weight", {dim, vocab});
  m.out_norm = f.read_f32("output_norm.weight", {dim});
  m.output = f.find_tensor("output.weight") ? f.read_f32("output.weight", {dim, vocab}) : m.tok_embd;
  m.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = m.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    l.attn_norm = f.read_f32(p + "attn_norm.weight", {dim});
    l.wq = f.read_f32(p + "attn_q.weight", {dim, q});
    l.wk = f.read_f32(p + "attn_k.weight", {dim, kv});
    l.wv = f.read_f32(p + "attn_v.weight", {dim, kv});
    l.wo = f.read_f32(p + "attn_output.weight", {q, dim});
    l.ffn_norm = f.read_f32(p + "ffn_norm.weight", {dim});
    l.w_gate = f.read_f32(p + "ffn_gate.weight", {dim, ff});
    l.w_up = f.read_f32(p + "ffn_up.weight", {dim, ff});
    l.w_down = f.read_f32(p + "ffn_down.weight", {ff, dim});
  }
  return m;
}

Model make_random_model(const ModelConfig& cfg, uint64_t seed) {
  ModelConfig c = cfg;
  if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  const auto bad = [](const std::string& what) { return Error("invalid model configuration: " + what); };
  if (c.n_layers <= 0 || c.dim <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.ff <= 0 || c.ctx <= 0) {
    throw bad("layers, dim, heads, kv heads, ff and ctx must all be positive");
  }
  if (c.dim % c.n_heads != 0) {
    throw bad("dim " + std::to_string(c.dim) + " is not divisible by the head count " + std::to_string(c.n_heads));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    throw bad("head count " + std::to_string(c.n_heads) + " is not a multiple of the KV head count " +
              std::to_string(c.n_kv_heads));
  }
  if (c.head_dim == 0) c.head_dim = c.dim / c.n_heads;
  if (c.head_dim != c.dim / c.n_heads) {
    throw bad("head_dim " + std::to_string(c.head_dim) +
              " differs from dim / heads = " + std::to_string(c.dim / c.n_heads));
  }
  if (c.vocab < 259) throw bad("vocab " + std::to_string(c.vocab) + " is below 259 (3 special + 256 byte tokens)");
  if (!(c.rms_eps > 0.0f) || !(c.rope_base > 1.0f)) throw bad("rms_eps must be positive and rope_base above 1");

  check_model_memory(c, "the random model");
  Model m;
  m.cfg = c;
  m.name = "synthetic";
  m.vocab = make_synthetic_vocab(c.vocab);
  const size_t dim = c.dim, q = c.q_width(), kv = c.kv_width(), ff = c.ff;
  Rng seeder(seed);
  const auto stream = [&seeder] { return Rng(seeder.next()); };  // an independent stream per tensor
  m.tok_embd = random_matrix(stream(), c.vocab, dim);
  m.out_norm = random_norm(stream(), dim);
  m.output = random_matrix(stream(), c.vocab, dim);
  m.layers.resize(c.n_layers);
  for (LayerWeights& l : m.layers) {
    l.attn_norm = random_norm(stream(), dim);
    l.wq = random_matrix(stream(), q, dim);
    l.wk = random_matrix(stream(), kv, dim);
    l.wv = random_matrix(stream(), kv, dim);
    l.wo = random_matrix(stream(), dim, q);
    l.ffn_norm = random_norm(stream(), dim);
    l.w_gate = random_matrix(stream(), ff, dim);
    l.w_up = random_matrix(stream(), ff, dim);
    l.w_down = random_matrix(stream(), dim, ff);
  }
  return m;
}

}  // namespace fd
