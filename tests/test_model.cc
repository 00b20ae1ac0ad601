#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "temp_files.h"
#include "runtime/gguf.h"
#include "runtime/gguf_writer.h"
#include "runtime/model.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using fd::GgmlType;
using fd::Model;
using fd::ModelConfig;

namespace {

// Each TempDir of this file is named after it.
struct TempDir : testing_files::TempDir {
  TempDir() : testing_files::TempDir("model") {}
};
using testing_files::Bytes;
using testing_files::find_bytes;
using testing_files::read_bytes;
using testing_files::write_bytes;

// Offset of the value of metadata key (encoded as length, bytes, value type).
size_t kv_value_offset(const Bytes& b, const std::string& key, fd::GgufType type) {
  std::string needle(8, '\0');
  const uint64_t len = key.size();
  std::memcpy(&needle[0], &len, 8);
  needle += key;
  const auto t = static_cast<uint32_t>(type);
  needle.append(reinterpret_cast<const char*>(&t), 4);
  return find_bytes(b, needle) + needle.size();
}

void poke_u32(Bytes& b, size_t offset, uint32_t v) {
  REQUIRE(offset + 4 <= b.size());
  std::memcpy(b.data() + offset, &v, 4);
}

void rename_bytes(Bytes& b, const std::string& from, const std::string& to) {
  REQUIRE(from.size() == to.size());
  std::memcpy(b.data() + find_bytes(b, from), to.data(), to.size());
}

std::string load_error(const std::string& path) {
  try {
    fd::load_model(path);
  } catch (const fd::Error& e) {
    return e.what();
  }
  FAIL("loading " << path << " did not throw");
  return {};
}

ModelConfig small_config() {
  ModelConfig c;
  c.n_layers = 2;
  c.dim = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ff = 96;
  c.vocab = 300;
  c.ctx = 77;
  c.rms_eps = 1e-6f;
  c.rope_base = 500000.0f;
  return c;
}

void check_config(const ModelConfig& a, const ModelConfig& b) {
  CHECK(a.n_layers == b.n_layers);
  CHECK(a.dim == b.dim);
  CHECK(a.n_heads == b.n_heads);
  CHECK(a.n_kv_heads == b.n_kv_heads);
  CHECK(a.head_dim == b.head_dim);
  CHECK(a.ff == b.ff);
  CHECK(a.vocab == b.vocab);
  CHECK(a.ctx == b.ctx);
  CHECK(a.rms_eps == b.rms_eps);
  CHECK(a.rope_base == b.rope_base);
}

// Whether |a[i] - b[i]| <= rel * |a[i]| + abs for every element.
bool close(const std::vector<float>& a, const std::vector<float>& b, double rel, double abs) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(static_cast<double>(a[i]) - b[i]) > rel * std::fabs(a[i]) + abs) return false;
  }
  return true;
}

// Whether b equals a within Q8_0 rounding: per block of 32, d = amax/127 is stored as fp16 (relative
// error 2^-11), so |x - q*d16| <= d/2 + 127*d*2^-11 < 0.57*d.
bool q8_close(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.size() % 32 != 0) return false;
  for (size_t blk = 0; blk < a.size(); blk += 32) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(a[blk + j]));
    for (size_t j = 0; j < 32; ++j) {
      if (std::fabs(a[blk + j] - b[blk + j]) > 0.57f * amax / 127.0f) return false;
    }
  }
  return true;
}

// Matrices within the rounding of the stored type; norm weights (always stored f32) exact.
void check_weights(const Model& want, const Model& got, double rel, double abs) {
  CHECK(close(want.tok_embd, got.tok_embd, rel, abs));
  CHECK(close(want.output, got.output, rel, abs));
  CHECK(want.out_norm == got.out_norm);
  REQUIRE(want.layers.size() == got.layers.size());
  for (size_t i = 0; i < want.layers.size(); ++i) {
    const fd::LayerWeights& w = want.layers[i];
    const fd::LayerWeights& g = got.layers[i];
    INFO("layer " << i);
    CHECK(w.attn_norm == g.attn_norm);
    CHECK(w.ffn_norm == g.ffn_norm);
    CHECK(close(w.wq, g.wq, rel, abs));
    CHECK(close(w.wk, g.wk, rel, abs));
    CHECK(close(w.wv, g.wv, rel, abs));
    CHECK(close(w.wo, g.wo, rel, abs));
    CHECK(close(w.w_gate, g.w_gate, rel, abs));
    CHECK(close(w.w_up, g.w_up, rel, abs));
    CHECK(close(w.w_down, g.w_down, rel, abs));
  }
}

void check_vocab(const fd::Vocab& a, const fd::Vocab& b) {
  CHECK(a.pieces == b.pieces);
  CHECK(a.scores == b.scores);
  CHECK(a.types == b.types);
  CHECK(a.bos == b.bos);
  CHECK(a.eos == b.eos);
  CHECK(a.unk == b.unk);
  CHECK(a.add_bos == b.add_bos);
  CHECK(a.add_space_prefix == b.add_space_prefix);
}

// Reads llama2.c's checkpoint format: 7 int32 (dim, hidden, layers, heads, kv heads, vocab, seq),
// then fp32 arrays in a fixed order.
class Llama2cReader {
 public:
  explicit Llama2cReader(const std::string& path) : bytes_(read_bytes(path)) {
    REQUIRE(bytes_.size() > 28);
    std::memcpy(header_, bytes_.data(), 28);
  }
  int header(int i) const { return header_[i]; }
  std::vector<float> next(size_t n) {
    REQUIRE(pos_ + 4 * n <= bytes_.size());
    std::vector<float> v(n);
    std::memcpy(v.data(), bytes_.data() + pos_, 4 * n);
    pos_ += 4 * n;
    return v;
  }
  // One array per layer, each of n floats.
  std::vector<std::vector<float>> per_layer(int layers, size_t n) {
    std::vector<std::vector<float>> v;
    for (int l = 0; l < layers; ++l) v.push_back(next(n));
    return v;
  }

 private:
  Bytes bytes_;
  int32_t header_[7];
  size_t pos_ = 28;
};

}  // namespace

TEST_CASE("stories260K loads with its config and the weights of llama2.c's export", "[model]") {
  const std::string dir = std::string(FD_SHARED_DIR) + "/models/";
  const Model m = fd::load_model(dir + "stories260K.gguf");
  CHECK(m.cfg.n_layers == 5);
  CHECK(m.cfg.dim == 64);
  CHECK(m.cfg.n_heads == 8);
  CHECK(m.cfg.n_kv_heads == 4);
  CHECK(m.cfg.head_dim == 8);
  CHECK(m.cfg.ff == 172);
  CHECK(m.cfg.vocab == 512);
  CHECK(m.cfg.ctx == 128);
  CHECK(m.cfg.rms_eps == 1e-5f);
  CHECK(m.cfg.rope_base == 10000.0f);
  CHECK(m.name == "llama");
  CHECK(m.vocab.size() == 512);
  CHECK(m.vocab.bos == 1);
  CHECK(m.vocab.eos == 2);
  CHECK(m.vocab.pieces[1] == "<s>");

  // The same weights in llama2.c's own format; GGUF's "normal" RoPE needs no Q/K permutation.
  Llama2cReader bin(dir + "stories260K.bin");
  const int dim = bin.header(0), hidden = bin.header(1), layers = bin.header(2),
            kv_dim = dim * bin.header(4) / bin.header(3);
  REQUIRE(dim == m.cfg.dim);
  REQUIRE(hidden == m.cfg.ff);
  REQUIRE(layers == m.cfg.n_layers);
  REQUIRE(bin.header(5) == 512);  // positive: the classifier shares the embedding
  CHECK(bin.next(512 * dim) == m.tok_embd);
  const auto rms_att = bin.per_layer(layers, dim);
  const auto wq = bin.per_layer(layers, dim * dim);
  const auto wk = bin.per_layer(layers, kv_dim * dim);
  const auto wv = bin.per_layer(layers, kv_dim * dim);
  const auto wo = bin.per_layer(layers, dim * dim);
  const auto rms_ffn = bin.per_layer(layers, dim);
  const auto w1 = bin.per_layer(layers, hidden * dim);
  const auto w2 = bin.per_layer(layers, dim * hidden);
  const auto w3 = bin.per_layer(layers, hidden * dim);
  CHECK(bin.next(dim) == m.out_norm);
  for (int l = 0; l < layers; ++l) {
    INFO("layer " << l);
    const fd::LayerWeights& w = m.layers[l];
    CHECK(rms_att[l] == w.attn_norm);
    CHECK(wq[l] == w.wq);
    CHECK(wk[l] == w.wk);
    CHECK(wv[l] == w.wv);
    CHECK(wo[l] == w.wo);
    CHECK(rms_ffn[l] == w.ffn_norm);
    CHECK(w1[l] == w.w_gate);
    CHECK(w2[l] == w.w_down);
    CHECK(w3[l] == w.w_up);
  }
  CHECK(m.output == m.tok_embd);  // the converter wrote the shared classifier out explicitly
}

TEST_CASE("random models are deterministic and scaled by fan-in", "[model]") {
  const ModelConfig c = small_config();
  const Model a = fd::make_random_model(c, 5);
  const Model b = fd::make_random_model(c, 5);
  const Model other = fd::make_random_model(c, 6);
  check_config(c, a.cfg);
  CHECK(a.name == "synthetic");
  CHECK(a.vocab.size() == c.vocab);
  check_weights(a, b, 0.0, 0.0);
  CHECK(a.tok_embd != other.tok_embd);
  CHECK(a.layers[0].wq != other.layers[0].wq);
  CHECK(a.layers[0].w_gate != a.layers[0].w_up);  // independent streams per tensor

  const auto within = [](const std::vector<float>& v, float lo, float hi) {
    const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
    return *mn >= lo && *mx <= hi && *mx - *mn > (hi - lo) * 0.9f;  // and spread over the range
  };
  const float s_dim = 1.0f / std::sqrt(64.0f), s_q = 1.0f / std::sqrt(64.0f), s_ff = 1.0f / std::sqrt(96.0f);
  CHECK(a.tok_embd.size() == 300u * 64);
  CHECK(within(a.tok_embd, -s_dim, s_dim));
  CHECK(within(a.output, -s_dim, s_dim));
  CHECK(within(a.out_norm, 0.95f, 1.05f));
  for (const fd::LayerWeights& l : a.layers) {
    CHECK(l.wq.size() == 64u * 64);
    CHECK(l.wk.size() == 32u * 64);
    CHECK(l.wo.size() == 64u * 64);
    CHECK(l.w_down.size() == 64u * 96);
    CHECK(within(l.wq, -s_dim, s_dim));
    CHECK(within(l.wk, -s_dim, s_dim));
    CHECK(within(l.wo, -s_q, s_q));
    CHECK(within(l.w_gate, -s_dim, s_dim));
    CHECK(within(l.w_down, -s_ff, s_ff));
    CHECK(within(l.attn_norm, 0.95f, 1.05f));
  }
  double mean = 0;
  for (float x : a.layers[1].w_up) mean += x;
  mean /= static_cast<double>(a.layers[1].w_up.size());
  CHECK(std::fabs(mean) < 0.01 * s_dim);  // uniform on a symmetric range: std of mean = s/sqrt(3*6144)
}

TEST_CASE("random model configuration is validated", "[model]") {
  ModelConfig c = small_config();
  c.n_heads = 5;
  CHECK_THROWS_WITH(fd::make_random_model(c, 1), Contains("not divisible by the head count 5"));
  c = small_config();
  c.n_kv_heads = 3;
  CHECK_THROWS_WITH(fd::make_random_model(c, 1), Contains("KV head count 3"));
  c = small_config();
  c.vocab = 100;
  CHECK_THROWS_WITH(fd::make_random_model(c, 1), Contains("vocab 100"));
  c = small_config();
  c.n_layers = 0;
  CHECK_THROWS_AS(fd::make_random_model(c, 1), fd::Error);
}

TEST_CASE("a model larger than the memory at hand is refused before its weights are allocated", "[model]") {
  ModelConfig c = small_config();
  const double need = fd::model_bytes(c);
  // Embedding and output [vocab][dim], per layer two norms, Q/K/V/O and the three MLP matrices.
  const double dim = c.dim, q = c.q_width(), kv = c.kv_width();
  CHECK(need == 4 * (2 * c.vocab * dim + dim + c.n_layers * (2 * dim + dim * (q + 2 * kv) + q * dim + 3 * c.ff * dim)));
  CHECK_NOTHROW(fd::check_model_memory(c, "small", static_cast<size_t>(need)));
  CHECK_THROWS_WITH(fd::check_model_memory(c, "small.gguf", static_cast<size_t>(need) - 1),
                    Contains("small.gguf: the model's weights take") && Contains("as fp32, more than"));
  // Far beyond any machine: a clear error instead of std::bad_alloc or the OOM killer.
  c.dim = 1 << 20;
  c.n_heads = 1 << 10;
  c.n_kv_heads = 1 << 10;
  c.head_dim = 0;
  c.ff = 1 << 20;
  CHECK_THROWS_WITH(fd::make_random_model(c, 1), Contains("the random model: the model's weights take"));
}

TEST_CASE("random model round-trips through GGUF", "[model]") {
  TempDir dir;
  const Model m = fd::make_random_model(small_config(), 11);

  SECTION("f32 exactly") {
    const std::string path = dir.file("f32.gguf");
    fd::write_model_gguf(m, path, GgmlType::f32);
    const Model r = fd::load_model(path);
    check_config(m.cfg, r.cfg);
    CHECK(r.name == "synthetic");
    check_vocab(m.vocab, r.vocab);
    check_weights(m, r, 0.0, 0.0);
    fd::GgufFile f(path);
    CHECK(f.find_tensor("output.weight") != nullptr);
    CHECK(f.find_tensor("blk.1.ffn_down.weight")->ne == std::vector<uint64_t>{96, 64});
    CHECK(f.find_tensor("blk.1.attn_k.weight")->ne == std::vector<uint64_t>{64, 32});
  }
  SECTION("f16 within fp16 rounding") {
    const std::string path = dir.file("f16.gguf");
    fd::write_model_gguf(m, path, GgmlType::f16);
    const Model r = fd::load_model(path);
    check_config(m.cfg, r.cfg);
    check_vocab(m.vocab, r.vocab);
    // Round to nearest with 11 significant bits: relative error 2^-11 for normal fp16 values; below
    // 2^-14 the spacing is 2^-24, so the absolute error is at most 2^-25.
    check_weights(m, r, 0x1.0p-11, 0x1.0p-25);
    CHECK_FALSE(close(m.tok_embd, r.tok_embd, 0x1.0p-14, 0.0));  // f16 really was used
    fd::GgufFile f(path);
    CHECK(f.find_tensor("blk.0.attn_q.weight")->type == GgmlType::f16);
    CHECK(f.find_tensor("token_embd.weight")->type == GgmlType::f16);
    CHECK(f.find_tensor("blk.0.attn_norm.weight")->type == GgmlType::f32);
  }
  SECTION("bf16 within bf16 rounding") {
    const std::string path = dir.file("bf16.gguf");
    fd::write_model_gguf(m, path, GgmlType::bf16);
    const Model r = fd::load_model(path);
    check_weights(m, r, 0x1.0p-8, 0.0);  // 8 significant bits, round to nearest; f32's exponent range
    CHECK_FALSE(close(m.tok_embd, r.tok_embd, 0x1.0p-11, 0.0));
  }
  SECTION("q8_0 within block quantization error") {
    const std::string path = dir.file("q8.gguf");
    fd::write_model_gguf(m, path, GgmlType::q8_0);
    const Model r = fd::load_model(path);
    CHECK(q8_close(m.tok_embd, r.tok_embd));
    CHECK(q8_close(m.output, r.output));
    CHECK(m.out_norm == r.out_norm);
    for (size_t i = 0; i < m.layers.size(); ++i) {
      const fd::LayerWeights& w = m.layers[i];
      const fd::LayerWeights& g = r.layers[i];
      CHECK(w.attn_norm == g.attn_norm);
      CHECK(q8_close(w.wq, g.wq));
      CHECK(q8_close(w.wk, g.wk));
      CHECK(q8_close(w.wv, g.wv));
      CHECK(q8_close(w.wo, g.wo));
      CHECK(q8_close(w.w_gate, g.w_gate));
      CHECK(q8_close(w.w_up, g.w_up));
      CHECK(q8_close(w.w_down, g.w_down));
    }
    CHECK_FALSE(close(m.tok_embd, r.tok_embd, 0x1.0p-8, 0.0));
  }
}

TEST_CASE("a model without output.weight ties the classifier to the embedding", "[model]") {
  TempDir dir;
  Model m = fd::make_random_model(small_config(), 3);
  m.output = m.tok_embd;
  const std::string path = dir.file("tied.gguf");
  fd::write_model_gguf(m, path, GgmlType::f32);
  {
    fd::GgufFile f(path);
    CHECK(f.find_tensor("output.weight") == nullptr);
    CHECK(f.find_tensor("token_embd.weight") != nullptr);
  }
  const Model r = fd::load_model(path);
  CHECK(r.output == m.tok_embd);
  CHECK(r.tok_embd == m.tok_embd);
}

TEST_CASE("load_model applies metadata defaults", "[model]") {
  TempDir dir;
  ModelConfig c = small_config();
  c.n_kv_heads = c.n_heads;
  const Model m = fd::make_random_model(c, 4);
  const std::string path = dir.file("defaults.gguf");
  fd::write_model_gguf(m, path, GgmlType::f32);
  Bytes b = read_bytes(path);
  rename_bytes(b, "llama.attention.head_count_kv", "llama.attention.head_count_xx");
  rename_bytes(b, "llama.rope.freq_base", "llama.rope.freq_xxxx");
  rename_bytes(b, "llama.vocab_size", "llama.vocab_xxxx");
  write_bytes(path, b);
  const Model r = fd::load_model(path);
  CHECK(r.cfg.n_kv_heads == c.n_heads);
  CHECK(r.cfg.rope_base == 10000.0f);
  CHECK(r.cfg.vocab == c.vocab);
}

TEST_CASE("load_model rejects inconsistent models with a clear message", "[model]") {
  TempDir dir;
  const Model m = fd::make_random_model(small_config(), 9);
  const std::string path = dir.file("bad.gguf");
  fd::write_model_gguf(m, path, GgmlType::f32);
  Bytes b = read_bytes(path);
  std::string phrase;

  SECTION("architecture") {
    rename_bytes(b, "llama", "mamba");  // the first "llama" is general.architecture's value
    phrase = "unsupported model architecture 'mamba'";
  }
  SECTION("heads not dividing dim") {
    poke_u32(b, kv_value_offset(b, "llama.attention.head_count", fd::GgufType::u32), 3);
    phrase = "embedding length 64 is not divisible by the head count 3";
  }
  SECTION("kv heads not dividing heads") {
    poke_u32(b, kv_value_offset(b, "llama.attention.head_count_kv", fd::GgufType::u32), 3);
    phrase = "head count 4 is not a multiple of the KV head count 3";
  }
  SECTION("vocab size disagreeing with the tokenizer") {
    poke_u32(b, kv_value_offset(b, "llama.vocab_size", fd::GgufType::u32), 301);
    phrase = "metadata 'llama.vocab_size' is 301 but the tokenizer has 300 tokens";
  }
  SECTION("zero layers") {
    poke_u32(b, kv_value_offset(b, "llama.block_count", fd::GgufType::u32), 0);
    phrase = "metadata 'llama.block_count' must be a positive integer";
  }
  SECTION("missing required metadata") {
    rename_bytes(b, "llama.feed_forward_length", "llama.feed_forward_lengtX");
    phrase = "missing metadata key 'llama.feed_forward_length'";
  }
  SECTION("missing tensor") {
    rename_bytes(b, "blk.1.attn_k.weight", "blk.1.attn_x.weight");
    phrase = "missing tensor 'blk.1.attn_k.weight'";
  }
  SECTION("wrong tensor shape") {
    poke_u32(b, kv_value_offset(b, "llama.feed_forward_length", fd::GgufType::u32), 64);
    phrase = "tensor 'blk.0.ffn_gate.weight' has shape [64, 96] but [64, 64] was expected";
  }
  SECTION("partial RoPE") {
    poke_u32(b, kv_value_offset(b, "llama.rope.dimension_count", fd::GgufType::u32), 8);
    phrase = "RoPE over 8 of 16 head dimensions is not supported";
  }
  REQUIRE_FALSE(phrase.empty());
  write_bytes(path, b);
  CHECK_THAT(load_error(path), StartsWith(path + ": ") && Contains(phrase));
}

TEST_CASE("fastdecode-mkmodel writes a loadable model and rejects bad flags", "[model][mkmodel]") {
  const std::string exe = std::string(FD_BIN_DIR) + "/fastdecode-mkmodel";
  REQUIRE(fs::exists(exe));  // built by the default target
  TempDir dir;
  const std::string path = dir.file("mk.gguf");
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const auto run = [&](const std::string& args) {
    const int status = std::system((exe + " " + args + " >" + out + " 2>" + err).c_str());
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
  };
  const auto text = [](const std::string& p) {
    const Bytes b = read_bytes(p);
    return std::string(b.begin(), b.end());
  };

  CHECK(run("--out " + path +
            " --layers 3 --dim 48 --heads 6 --kv-heads 2 --ff 80 --vocab 400 --ctx 40 --dtype f16 --seed 8") == 0);
  CHECK_THAT(text(out), StartsWith("wrote " + path));
  const Model m = fd::load_model(path);
  CHECK(m.cfg.n_layers == 3);
  CHECK(m.cfg.dim == 48);
  CHECK(m.cfg.n_heads == 6);
  CHECK(m.cfg.n_kv_heads == 2);
  CHECK(m.cfg.head_dim == 8);
  CHECK(m.cfg.ff == 80);
  CHECK(m.cfg.vocab == 400);
  CHECK(m.cfg.ctx == 40);
  fd::GgufFile f(path);
  CHECK(f.find_tensor("blk.2.ffn_up.weight")->type == GgmlType::f16);

  const std::vector<std::string> bad_args = {
      "--out " + path + " --layers two",       "--out " + path + " --dtype f8",
      "--out " + path + " --bogus 1",          "--layers 2",
      "--out " + path + " --dim 50 --heads 4", "--out " + path + " --dtype q8_0 --ff 100",
      "--out " + path + " --dim 1048576 --heads 1024 --layers 64"};
  for (const std::string& bad : bad_args) {
    INFO(bad);
    CHECK(run(bad) == 2);
    const std::string e = text(err);
    CHECK_THAT(e, StartsWith("fastdecode-mkmodel: "));
    CHECK(std::count(e.begin(), e.end(), '\n') == 1);
  }
}
