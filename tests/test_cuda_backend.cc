#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/backend_loader.h"
#include "runtime/error.h"
#include "runtime/model.h"
#include "runtime/spart.h"
#include "tests/reference_model.h"
#include "tests/test_models.h"

namespace {
using test_models::first_argmax;
using test_models::top2_gap;

fd::ModelConfig config(int n_layers, int dim, int n_heads, int n_kv_heads, int ff, int vocab) {
  return test_models::config(n_layers, dim, n_heads, n_kv_heads, ff, vocab, 128);
}

// The CUDA backend rounds weights and GEMM inputs to fp16 (2^-11 relative each), so each product
// of a dot product is off by up to 2^-10 relative, with random sign; those errors add up like the
// products themselves, leaving a GEMM output off by ~2^-10 = 1e-3 of its scale (K/V add one more
// 2^-11 rounding, the MLP chains three GEMMs). 1e-2 leaves margin; a wrong index or formula
// gives errors of order 1.
constexpr double kOpTol = 1e-2;
// Whole decode steps: the per-layer errors above accumulate in the residual stream over the
// layers (2 to 5 here), so logits may drift by a few kOpTol/3.
constexpr double kStepTol = 2e-2;

// Sets (or, with value null, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// The CUDA backend, or null after a warning that the calling test is skipped.
std::unique_ptr<fd::SPartBackend> cuda_or_skip(const fd::Model& m, int max_rows = 4096) {
  std::string why;
  if (fd::cuda_device_count(&why) == 0) {
    // scripts/gpu-check sets this: there, a missing GPU is a failure, not a skip.
    if (std::getenv("FASTDECODE_REQUIRE_GPU") != nullptr) FAIL("no usable GPU: " << why);
    WARN("skipped: no GPU, so the CUDA backend is not tested here (" << why << ")");
    return nullptr;
  }
  fd::BackendOptions opt;
  opt.max_rows = max_rows;
  std::string note;
  auto b = fd::make_backend("cuda", m, &note, opt);
  REQUIRE(std::string(b->name()) == "cuda");
  return b;
}

// max|a - b| / max|b|; A and B: float arrays (std::vector, fd::TypedBytes)
template <class A, class B>
double norm_err(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(!b.empty());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  REQUIRE(scale > 0.0);
  return err / scale;
}

template <class H>  // fp16 bits: std::vector<uint16_t>, fd::TypedBytes<uint16_t>
std::vector<float> widen(const H& h) {
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = ref::f16_bits_to_float(h[i]);
  return out;
}



// A step of rows tokens spread over sequences at scattered positions (below 100), with the
// logits of every third row.
fd::StepInput scattered_step(int rows, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1), pos(0, 99);
  fd::StepInput in;
  for (int r = 0; r < rows; ++r) {
    in.tokens.push_back(tok(rng));
    in.pos.push_back(pos(rng));
    if (r % 3 == 0) in.logit_rows.push_back(r);
  }
  return in;
}

// Runs the same calls on the CUDA and the CPU backend and compares every output: embedding
// through final norm and LM head, then per layer RMSNorm + QKV + RoPE (attn_in) and, with the
// same attention output O for both, Wo + residual + MLP (attn_out, seen through the logits).
void compare_ops(const fd::Model& m, std::initializer_list<int> steps = {15, 40, 3}) {
  auto gpu = cuda_or_skip(m);
  if (!gpu) return;
  auto cpu = fd::make_cpu_backend(m);
  const fd::ModelConfig& c = m.cfg;
  auto gs = gpu->make_state();
  auto cs = cpu->make_state();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  // By default 15 rows, then 40 (the scratch grows), then 3.
  for (int rows : steps) {
    INFO("step of " << rows << " rows");
    const fd::StepInput in = scattered_step(rows, c.vocab, static_cast<uint32_t>(rows));
    gpu->embed(*gs, in);
    cpu->embed(*cs, in);
    std::vector<float> lg, lc;
    gpu->logits(*gs, lg);
    cpu->logits(*cs, lc);
    REQUIRE(lg.size() == in.logit_rows.size() * c.vocab);
    CHECK(norm_err(lg, lc) <= kOpTol);
    for (int l = 0; l < c.n_layers; ++l) {
      INFO("layer " << l);
      fd::AttnIn ag, ac;
      gpu->attn_in(*gs, l, ag);
      cpu->attn_in(*cs, l, ac);
      CHECK(norm_err(ag.q, ac.q) <= kOpTol);
      CHECK(norm_err(widen(ag.k), widen(ac.k)) <= kOpTol);
      CHECK(norm_err(widen(ag.v), widen(ac.v)) <= kOpTol);
      std::vector<float> o(static_cast<size_t>(rows) * c.q_width());
      for (float& v : o) v = unit(rng);
      gpu->attn_out(*gs, l, o.data());
      cpu->attn_out(*cs, l, o.data());
      gpu->logits(*gs, lg);
      cpu->logits(*cs, lc);
      CHECK(norm_err(lg, lc) <= kOpTol);
    }
  }
}

// One backend and the K/V caches it filled, with attention done here by the scalar reference
// (standing in for the R-part).
class Runner {
 public:
  Runner(const fd::SPartBackend& b, int n_seq)
      : b_(b), c_(b.config()), state_(b.make_state()),
        k_(static_cast<size_t>(n_seq), std::vector<std::vector<float>>(c_.n_layers)),
        v_(k_) {}

  // row_seq: [rows] the sequence of each row of in. Returns the logits.
  std::vector<float> step(const fd::StepInput& in, const std::vector<int>& row_seq) {
    const int rows = static_cast<int>(in.tokens.size());
    const size_t kvw = c_.kv_width(), qw = c_.q_width();
    b_.embed(*state_, in);
    fd::AttnIn a;
    std::vector<float> o(static_cast<size_t>(rows) * qw);
    for (int l = 0; l < c_.n_layers; ++l) {
      b_.attn_in(*state_, l, a);
      const std::vector<float> k = widen(a.k), v = widen(a.v);
      for (int r = 0; r < rows; ++r) {
        std::vector<float>& kl = k_[row_seq[r]][l];
        std::vector<float>& vl = v_[row_seq[r]][l];
        kl.insert(kl.end(), k.begin() + r * kvw, k.begin() + (r + 1) * kvw);
        vl.insert(vl.end(), v.begin() + r * kvw, v.begin() + (r + 1) * kvw);
      }
      for (int r = 0; r < rows; ++r) {
        ref::attention(a.q.data() + r * qw, k_[row_seq[r]][l].data(), v_[row_seq[r]][l].data(),
                       in.pos[r] + 1, c_.n_heads, c_.n_kv_heads, c_.head_dim, o.data() + r * qw);
      }
      b_.attn_out(*state_, l, o.data());
    }
    std::vector<float> logits;
    b_.logits(*state_, logits);
    return logits;
  }

 private:
  const fd::SPartBackend& b_;
  fd::ModelConfig c_;
  std::unique_ptr<fd::SPartState> state_;
  std::vector<std::vector<std::vector<float>>> k_, v_;  // [seq][layer][len][kv_width]
};

// Prefills the prompts in one step, then decodes n_decode steps greedily on both backends, each
// with its own K/V. The next token of each sequence is the CPU backend's argmax (so both stay on
// the same tokens); the CUDA backend must pick the same token wherever the CPU's top two logits
// are further apart than the tolerance allows to swap.
void compare_greedy(const fd::Model& m, const std::vector<std::vector<int32_t>>& prompts, int n_decode) {
  auto gpu = cuda_or_skip(m);
  if (!gpu) return;
  auto cpu = fd::make_cpu_backend(m);
  const int n_seq = static_cast<int>(prompts.size());
  const int vocab = m.cfg.vocab;
  Runner rg(*gpu, n_seq), rc(*cpu, n_seq);
  std::vector<int> len(static_cast<size_t>(n_seq), 0);
  std::vector<std::vector<int32_t>> feed = prompts;
  int rows_checked = 0, tokens_compared = 0;
  for (int step = 0; step <= n_decode; ++step) {
    std::vector<int> row_seq;
    const fd::StepInput in = test_models::feed_step(feed, len, row_seq);
    const std::vector<float> lg = rg.step(in, row_seq);
    const std::vector<float> lc = rc.step(in, row_seq);
    REQUIRE(lg.size() == static_cast<size_t>(n_seq) * vocab);
    for (int s = 0; s < n_seq; ++s) {
      const std::vector<float> g(lg.begin() + s * vocab, lg.begin() + (s + 1) * vocab);
      const std::vector<float> w(lc.begin() + s * vocab, lc.begin() + (s + 1) * vocab);
      INFO("step " << step << " sequence " << s);
      const double err = norm_err(g, w);
      CHECK(err <= kStepTol);
      ++rows_checked;
      float max_abs = 0.0f;
      for (float v : w) max_abs = std::max(max_abs, std::fabs(v));
      const int next = first_argmax(w.data(), vocab);
      if (top2_gap(w.data(), vocab) > 2 * kStepTol * max_abs) {
        CHECK(first_argmax(g.data(), vocab) == next);
        ++tokens_compared;
      }
      feed[s] = {static_cast<int32_t>(next)};
    }
  }
  REQUIRE(rows_checked == n_seq * (n_decode + 1));
  // Near-ties are rare; most tokens must be compared for the test to mean anything.
  REQUIRE(tokens_compared >= rows_checked * 3 / 4);
}

}  // namespace

TEST_CASE("backend loader: auto falls back to the CPU and cuda explains why without a GPU", "[cuda]") {
  const fd::Model m = fd::make_random_model(config(1, 64, 4, 2, 128, 300), 3);
  std::string why;
  const int gpus = fd::cuda_device_count(&why);
  std::string note;
  auto cpu = fd::make_backend("cpu", m, &note);
  CHECK(std::string(cpu->name()) == "cpu");
  auto b = fd::make_backend("auto", m, &note);
  INFO("note: " << note);
  CHECK(note.find('\n') == std::string::npos);
  if (gpus == 0) {
    CHECK(std::string(b->name()) == "cpu");
    CHECK(!why.empty());
    CHECK_THAT(note, Catch::Contains("cpu") && Catch::Contains(why));
    CHECK_THROWS_WITH(fd::make_backend("cuda", m, &note),
                      Catch::Contains("CUDA backend") &&
                          (Catch::Contains("no usable CUDA GPU") || Catch::Contains("module")));
  } else {
    CHECK(std::string(b->name()) == "cuda");
    CHECK_THAT(note, Catch::Contains("cuda"));
  }
  CHECK_THROWS_AS(fd::make_backend("tpu", m, &note), fd::Error);
}

TEST_CASE("backend loader: a missing CUDA module is reported, not fatal for auto", "[cuda]") {
  const std::string path = "/nonexistent/dir/libfastdecode_cuda.so";
  ScopedEnv env("FASTDECODE_CUDA_MODULE", path.c_str());
  CHECK(fd::cuda_module_path() == path);
  std::string why;
  CHECK(fd::cuda_device_count(&why) == 0);
  CHECK_THAT(why, Catch::Contains(path));
  CHECK(fd::cuda_device_name(0).empty());
  const fd::Model m = fd::make_random_model(config(1, 64, 4, 2, 128, 300), 3);
  std::string note;
  auto b = fd::make_backend("auto", m, &note);
  CHECK(std::string(b->name()) == "cpu");
  CHECK_THAT(note, Catch::Contains(path));
  CHECK_THROWS_WITH(fd::make_backend("cuda", m, &note),
                    Catch::Contains("CUDA backend") && Catch::Contains(path));
}

TEST_CASE("backend loader: the CUDA module built next to the tests loads", "[cuda]") {
  ScopedEnv env("FASTDECODE_CUDA_MODULE", nullptr);
  const std::string path = fd::cuda_module_path();
  // The module is looked up next to the running executable, which is the build folder unless the
  // binaries were copied elsewhere (as for a GPU machine without the build tree).
  std::error_code ec;
  const auto exe = std::filesystem::canonical("/proc/self/exe", ec);
  if (!ec && std::filesystem::equivalent(exe.parent_path(), FD_BIN_DIR, ec)) {
    CHECK(path == std::string(FD_BIN_DIR) + "/libfastdecode_cuda.so");
  } else {
    WARN("module path not compared with the build folder " FD_BIN_DIR ": these tests run from "
         << exe.parent_path().string());
  }
  if (!std::ifstream(path).good()) {
    WARN("skipped: " << path
                      << " is missing (not built, for want of a CUDA compiler at configure time, or not copied with "
                         "the tests)");
    return;
  }
  std::string why;
  const int gpus = fd::cuda_device_count(&why);
  INFO("why: " << why);
  // dlopen and dlsym succeeded: any reason left is about the GPU, not the module.
  CHECK(why.find("could not be loaded") == std::string::npos);
  CHECK(why.find("lacks") == std::string::npos);
  if (gpus == 0) {
    CHECK_THAT(why, Catch::Contains("no usable CUDA GPU"));
  } else {
    CHECK(!fd::cuda_device_name(0).empty());
  }
}

TEST_CASE("CUDA backend matches the CPU backend op by op on a random model", "[cuda]") {
  compare_ops(fd::make_random_model(config(2, 256, 8, 4, 688, 512), 11));
}

TEST_CASE("CUDA backend matches the CPU backend op by op with head_dim 128 and 4:1 GQA", "[cuda]") {
  compare_ops(fd::make_random_model(config(2, 512, 4, 1, 1376, 1000), 12));
}

TEST_CASE("CUDA backend matches the CPU backend op by op when Q/K/V and O cross in pieces", "[cuda]") {
  // 1999 rows of 8 KiB of Q/K/V: three pieces of about 5.2 MiB, whose ends fall inside Q and K,
  // then a one-piece step again.
  compare_ops(fd::make_random_model(config(1, 1024, 8, 8, 256, 300), 13), {1999, 5});
}

TEST_CASE("CUDA backend matches the CPU backend op by op on stories260K", "[cuda]") {
  compare_ops(fd::load_model(test_models::stories_path()));
}

TEST_CASE("CUDA backend decodes greedily like the CPU backend on a random model", "[cuda]") {
  const fd::Model m = fd::make_random_model(config(2, 256, 8, 2, 688, 512), 21);
  compare_greedy(m, {{5, 17, 200, 9, 33}, {1}, {7, 8, 9, 10, 11, 12, 13, 14, 15}}, 12);
}

TEST_CASE("CUDA backend decodes greedily like the CPU backend on stories260K", "[cuda]") {
  const fd::Model m = fd::load_model(test_models::stories_path());
  compare_greedy(m, {{1, 403, 407}, {1}, {1, 263, 13, 42, 99, 300}}, 16);
}

TEST_CASE("CUDA backend rejects malformed steps and steps over its row limit", "[cuda]") {
  const fd::Model m = fd::make_random_model(config(1, 64, 4, 4, 128, 300), 5);
  auto gpu = cuda_or_skip(m, 32);
  if (!gpu) return;
  auto s = gpu->make_state();
  fd::StepInput in;
  in.tokens = {5, 300};
  in.pos = {0, 1};
  in.logit_rows = {1};
  CHECK_THROWS_AS(gpu->embed(*s, in), fd::Error);
  in.tokens = {5, 6};
  in.pos = {0};
  CHECK_THROWS_AS(gpu->embed(*s, in), fd::Error);
  in.pos = {0, 1};
  in.logit_rows = {2};
  CHECK_THROWS_AS(gpu->embed(*s, in), fd::Error);
  const fd::StepInput big = scattered_step(33, m.cfg.vocab, 1);
  CHECK_THROWS_WITH(gpu->embed(*s, big), Catch::Contains("limit of 32 rows"));
  // The state stays usable after rejected steps.
  in.logit_rows = {1};
  REQUIRE_NOTHROW(gpu->embed(*s, in));
  fd::AttnIn a;
  CHECK_THROWS_AS(gpu->attn_in(*s, 1, a), fd::Error);
  REQUIRE_NOTHROW(gpu->attn_in(*s, 0, a));
  CHECK(a.q.size() == 2u * m.cfg.q_width());
  auto cpu_state = fd::make_cpu_backend(m)->make_state();
  CHECK_THROWS_AS(gpu->embed(*cpu_state, in), fd::Error);
  std::vector<float> logits;
  REQUIRE_NOTHROW(gpu->logits(*s, logits));
  CHECK(logits.size() == static_cast<size_t>(m.cfg.vocab));
}
