#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "runtime/error.h"
#include "runtime/model.h"
#include "runtime/parallel.h"
#include "runtime/spart.h"
#include "tests/reference_model.h"
#include "tests/test_models.h"

namespace {

fd::ModelConfig config(int n_layers, int dim, int n_heads, int n_kv_heads, int ff, int vocab) {
  return test_models::config(n_layers, dim, n_heads, n_kv_heads, ff, vocab, 64);
}
using test_models::random_prompts;

// TP against G=1: the Wo and W_down dot products are summed in another order (per-rank partials
// of k/G terms, then G partials), a relative error of ~k*2^-24 (k <= 174: 1e-5) of the terms'
// magnitude; a K/V value whose fp32 inputs moved by that may round to the neighbouring fp16
// value (2^-10 relative), which test_cpu_backend measured to move logits by up to 1.2e-4 of
// their max. 5e-4 of the logits' max abs covers both; a wrong slice makes O(1) errors.
constexpr float kTpRelTol = 5e-4f;


// 8 heads over 4 KV heads (GQA 2:1), head_dim 16, an MLP width 4 does not divide, 5 layers
// (uneven pipeline stages for G = 2 and 4).
fd::Model test_model() { return fd::make_random_model(config(5, 128, 8, 4, 174, 320), 4242); }


// One R-worker group: the fp16 K/V of its KV heads for every sequence and layer, attended by
// the scalar reference.
class KvGroup {
 public:
  KvGroup(int n_seq, int n_layers, int heads, int kv_heads, int head_dim)
      : heads_(heads), kv_heads_(kv_heads), hd_(head_dim),
        k_(static_cast<size_t>(n_seq), std::vector<std::vector<float>>(n_layers)),
        v_(k_) {}

  // Caches the step's K/V rows and fills o [rows][heads*head_dim], causally by position.
  void attend(int layer, const fd::AttnIn& a, const std::vector<int>& row_seq,
              const std::vector<int32_t>& pos, std::vector<float>& o) {
    const size_t rows = row_seq.size();
    const size_t kvw = static_cast<size_t>(kv_heads_) * hd_, qw = static_cast<size_t>(heads_) * hd_;
    REQUIRE(a.q.size() == rows * qw);
    REQUIRE(a.k.size() == rows * kvw);
    REQUIRE(a.v.size() == rows * kvw);
    for (size_t r = 0; r < rows; ++r) {
      std::vector<float>& kl = k_[row_seq[r]][layer];
      std::vector<float>& vl = v_[row_seq[r]][layer];
      REQUIRE(kl.size() == static_cast<size_t>(pos[r]) * kvw);
      for (size_t j = 0; j < kvw; ++j) {
        kl.push_back(ref::f16_bits_to_float(a.k[r * kvw + j]));
        vl.push_back(ref::f16_bits_to_float(a.v[r * kvw + j]));
      }
    }
    o.assign(rows * qw, 0.0f);
    for (size_t r = 0; r < rows; ++r) {
      const int s = row_seq[r];
      ref::attention(a.q.data() + r * qw, k_[s][layer].data(), v_[s][layer].data(), pos[r] + 1,
                     heads_, kv_heads_, hd_, o.data() + r * qw);
    }
  }

 private:
  int heads_, kv_heads_, hd_;
  std::vector<std::vector<std::vector<float>>> k_, v_;  // [seq][layer][len*kv_width]
};

// Runs one step through some S-part arrangement: logits [logit_rows][vocab].
using Forward = std::function<void(const fd::StepInput& in, const std::vector<int>& row_seq,
                                   std::vector<float>& logits)>;

struct Run {
  std::vector<std::vector<float>> logits;    // [step][n_seq*vocab]
  std::vector<std::vector<int32_t>> tokens;  // [seq][n_decode+1] greedy picks
};

// Prefills all prompts in one step, then decodes them together for n_decode steps, each
// sequence feeding back its own argmax.
Run generate(const Forward& forward, const std::vector<std::vector<int32_t>>& prompts,
             int n_decode, int vocab) {
  const size_t n_seq = prompts.size();
  std::vector<std::vector<int32_t>> feed = prompts;
  std::vector<int> len(n_seq, 0);
  Run run;
  run.tokens.resize(n_seq);
  std::vector<float> logits;
  for (int step = 0; step <= n_decode; ++step) {
    std::vector<int> row_seq;
    const fd::StepInput in = test_models::feed_step(feed, len, row_seq);
    forward(in, row_seq, logits);
    REQUIRE(logits.size() == n_seq * vocab);
    for (size_t s = 0; s < n_seq; ++s) {
      const float* l = logits.data() + s * vocab;
      const auto next = static_cast<int32_t>(std::max_element(l, l + vocab) - l);
      run.tokens[s].push_back(next);
      feed[s] = {next};
    }
    run.logits.push_back(logits);
  }
  return run;
}

Run run_single(const fd::Model& m, const std::vector<std::vector<int32_t>>& prompts,
               int n_decode) {
  const fd::ModelConfig& c = m.cfg;
  auto backend = fd::make_cpu_backend(m);
  auto state = backend->make_state();
  KvGroup kv(static_cast<int>(prompts.size()), c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
  fd::AttnIn attn;
  std::vector<float> o;
  const Forward fwd = [&](const fd::StepInput& in, const std::vector<int>& row_seq,
                          std::vector<float>& logits) {
    backend->embed(*state, in);
    for (int l = 0; l < c.n_layers; ++l) {
      backend->attn_in(*state, l, attn);
      kv.attend(l, attn, row_seq, in.pos, o);
      backend->attn_out(*state, l, o.data());
    }
    backend->logits(*state, logits);
  };
  return generate(fwd, prompts, n_decode, c.vocab);
}

// Sums the ranks' partials in rank order, as the coordinating actor does.
void all_reduce(const std::vector<std::vector<float>>& partial, std::vector<float>& sum) {
  sum = partial[0];
  for (size_t g = 1; g < partial.size(); ++g) {
    REQUIRE(partial[g].size() == sum.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += partial[g][i];
  }
}

Run run_tp(const fd::Model& m, int size, const std::vector<std::vector<int32_t>>& prompts,
           int n_decode) {
  const fd::ModelConfig& c = m.cfg;
  const int n_seq = static_cast<int>(prompts.size());
  std::vector<std::unique_ptr<fd::TpRankBackend>> ranks;
  std::vector<std::unique_ptr<fd::TpRankState>> states;
  std::vector<KvGroup> kv;
  for (int g = 0; g < size; ++g) {
    const fd::TpSlice sl = fd::tp_slice(c, g, size);
    ranks.push_back(std::make_unique<fd::TpRankBackend>(m, sl));
    REQUIRE(ranks.back()->q_width() == c.q_width() / size);
    REQUIRE(ranks.back()->kv_width() == c.kv_width() / size);
    states.push_back(ranks.back()->make_state());
    kv.emplace_back(n_seq, c.n_layers, sl.heads, sl.kv_heads, c.head_dim);
  }
  fd::AttnIn attn;
  std::vector<float> o, sum, last_rank_logits;
  std::vector<std::vector<float>> partial(static_cast<size_t>(size));
  const Forward fwd = [&](const fd::StepInput& in, const std::vector<int>& row_seq,
                          std::vector<float>& logits) {
    for (int g = 0; g < size; ++g) ranks[g]->embed(*states[g], in);
    for (int l = 0; l < c.n_layers; ++l) {
      for (int g = 0; g < size; ++g) {
        ranks[g]->attn_in(*states[g], l, attn);
        kv[g].attend(l, attn, row_seq, in.pos, o);
        ranks[g]->attn_proj(*states[g], l, o.data(), partial[g]);
      }
      all_reduce(partial, sum);
      for (int g = 0; g < size; ++g) ranks[g]->add_residual(*states[g], sum.data());
      for (int g = 0; g < size; ++g) ranks[g]->mlp(*states[g], l, partial[g]);
      all_reduce(partial, sum);
      for (int g = 0; g < size; ++g) ranks[g]->add_residual(*states[g], sum.data());
    }
    ranks[0]->logits(*states[0], logits);
    // x stays replicated: every rank computes the very same logits.
    ranks[size - 1]->logits(*states[size - 1], last_rank_logits);
    REQUIRE(last_rank_logits == logits);
  };
  return generate(fwd, prompts, n_decode, c.vocab);
}

Run run_pp(const fd::Model& m, int size, const std::vector<std::vector<int32_t>>& prompts,
           int n_decode) {
  const fd::ModelConfig& c = m.cfg;
  const int n_seq = static_cast<int>(prompts.size());
  std::vector<fd::Model> models;
  for (int st = 0; st < size; ++st) models.push_back(fd::pp_model(m, fd::pp_stage(c, st, size)));
  std::vector<std::unique_ptr<fd::SPartBackend>> stages;
  std::vector<std::unique_ptr<fd::SPartState>> states;
  std::vector<KvGroup> kv;
  for (const fd::Model& sm : models) {
    stages.push_back(fd::make_cpu_backend(sm));
    states.push_back(stages.back()->make_state());
    kv.emplace_back(n_seq, sm.cfg.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
  }
  fd::AttnIn attn;
  std::vector<float> o, x;
  const Forward fwd = [&](const fd::StepInput& in, const std::vector<int>& row_seq,
                          std::vector<float>& logits) {
    for (int st = 0; st < size; ++st) {
      if (st == 0) {
        stages[0]->embed(*states[0], in);
      } else {
        stages[st - 1]->get_x(*states[st - 1], x);
        REQUIRE(x.size() == in.tokens.size() * c.dim);
        stages[st]->set_x(*states[st], in, x.data());
      }
      for (int l = 0; l < stages[st]->config().n_layers; ++l) {
        stages[st]->attn_in(*states[st], l, attn);
        kv[st].attend(l, attn, row_seq, in.pos, o);
        stages[st]->attn_out(*states[st], l, o.data());
      }
    }
    stages[size - 1]->logits(*states[size - 1], logits);
  };
  return generate(fwd, prompts, n_decode, c.vocab);
}

// Logits within rel_tol of want's max abs per row, and identical greedy tokens.
void compare(const Run& want, const Run& got, int vocab, float rel_tol) {
  REQUIRE(got.logits.size() == want.logits.size());
  float worst = 0.0f, min_gap = INFINITY;
  for (size_t step = 0; step < want.logits.size(); ++step) {
    const std::vector<float>& w = want.logits[step];
    const std::vector<float>& g = got.logits[step];
    REQUIRE(g.size() == w.size());
    for (size_t row = 0; row < w.size() / vocab; ++row) {
      const float* wr = w.data() + row * vocab;
      const float* gr = g.data() + row * vocab;
      float max_abs = 0.0f, max_err = 0.0f;
      for (int i = 0; i < vocab; ++i) {
        max_abs = std::max(max_abs, std::fabs(wr[i]));
        max_err = std::max(max_err, std::fabs(gr[i] - wr[i]));
      }
      std::vector<float> sorted(wr, wr + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      INFO("step " << step << " row " << row << " max_abs " << max_abs << " max_err " << max_err);
      REQUIRE(max_abs > 0.0f);
      REQUIRE(max_err <= rel_tol * max_abs);
      worst = std::max(worst, max_err / max_abs);
      min_gap = std::min(min_gap, (sorted[0] - sorted[1]) / max_abs);
    }
  }
  INFO("worst relative logit error " << worst << ", smallest relative top-2 gap " << min_gap);
  REQUIRE(got.tokens == want.tokens);
  // Every pick was decided by more than the logit error, so identical tokens are no coincidence.
  REQUIRE(min_gap > 2 * worst);
}

constexpr int kDecode = 20;

}  // namespace

TEST_CASE("tp_slice splits heads evenly and the MLP as evenly as possible", "[parallel]") {
  const fd::ModelConfig c = config(5, 128, 8, 4, 174, 320);
  const int want_ff[4] = {44, 44, 43, 43}, want_ff0[4] = {0, 44, 88, 131};
  for (int r = 0; r < 4; ++r) {
    const fd::TpSlice s = fd::tp_slice(c, r, 4);
    CHECK(s.rank == r);
    CHECK(s.size == 4);
    CHECK(s.head0 == 2 * r);
    CHECK(s.heads == 2);
    CHECK(s.kv_head0 == r);
    CHECK(s.kv_heads == 1);
    CHECK(s.ff == want_ff[r]);
    CHECK(s.ff0 == want_ff0[r]);
  }
  const fd::TpSlice two = fd::tp_slice(c, 1, 2);
  CHECK(two.head0 == 4);
  CHECK(two.heads == 4);
  CHECK(two.kv_head0 == 2);
  CHECK(two.kv_heads == 2);
  CHECK(two.ff0 == 87);
  CHECK(two.ff == 87);
  const fd::TpSlice one = fd::tp_slice(c, 0, 1);
  CHECK(one.heads == 8);
  CHECK(one.kv_heads == 4);
  CHECK(one.ff == 174);

  REQUIRE_THROWS_AS(fd::tp_slice(c, 0, 3), fd::Error);   // 8 heads
  REQUIRE_THROWS_AS(fd::tp_slice(c, 0, 8), fd::Error);   // 4 KV heads
  REQUIRE_THROWS_AS(fd::tp_slice(c, 4, 4), fd::Error);   // no such rank
  REQUIRE_THROWS_AS(fd::tp_slice(c, -1, 4), fd::Error);
  REQUIRE_THROWS_AS(fd::tp_slice(c, 0, 0), fd::Error);
  REQUIRE_THROWS_AS(fd::tp_slice(config(1, 64, 4, 4, 3, 320), 0, 4), fd::Error);  // ff < ranks

  const fd::Model m = fd::make_random_model(config(1, 64, 8, 4, 40, 300), 3);
  fd::TpSlice bad = fd::tp_slice(m.cfg, 1, 2);
  REQUIRE_NOTHROW(fd::TpRankBackend(m, bad));
  bad.head0 = 0;
  REQUIRE_THROWS_AS(fd::TpRankBackend(m, bad), fd::Error);
}

TEST_CASE("pp_stage splits layers into consecutive, near-even stages", "[parallel]") {
  const fd::ModelConfig c = config(5, 64, 8, 4, 40, 300);
  const int want4[4][2] = {{0, 2}, {2, 1}, {3, 1}, {4, 1}};
  for (int st = 0; st < 4; ++st) {
    const fd::PpStage s = fd::pp_stage(c, st, 4);
    CHECK(s.stage == st);
    CHECK(s.size == 4);
    CHECK(s.layer0 == want4[st][0]);
    CHECK(s.layers == want4[st][1]);
  }
  CHECK(fd::pp_stage(c, 1, 2).layer0 == 3);
  CHECK(fd::pp_stage(c, 1, 2).layers == 2);
  CHECK(fd::pp_stage(c, 4, 5).layer0 == 4);
  REQUIRE_THROWS_AS(fd::pp_stage(c, 0, 6), fd::Error);
  REQUIRE_THROWS_AS(fd::pp_stage(c, 2, 2), fd::Error);
  REQUIRE_THROWS_AS(fd::pp_stage(c, 0, 0), fd::Error);

  const fd::Model m = fd::make_random_model(c, 8);
  const fd::Model sm = fd::pp_model(m, fd::pp_stage(c, 0, 4));
  REQUIRE(sm.cfg.n_layers == 2);
  REQUIRE(sm.layers.size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(sm.layers[i].wq == m.layers[i].wq);
    CHECK(sm.layers[i].w_down == m.layers[i].w_down);
  }
  const fd::Model last = fd::pp_model(m, fd::pp_stage(c, 3, 4));
  REQUIRE(last.layers.size() == 1);
  CHECK(last.layers[0].wo == m.layers[4].wo);
  CHECK(last.output == m.output);
  CHECK(last.tok_embd == m.tok_embd);
  fd::PpStage bad = fd::pp_stage(c, 3, 4);
  bad.layers = 2;
  REQUIRE_THROWS_AS(fd::pp_model(m, bad), fd::Error);
}

TEST_CASE("a one-rank TP backend computes exactly what the CPU backend does", "[parallel]") {
  const fd::Model m = test_model();
  const auto prompts = random_prompts({5, 1, 9}, m.cfg.vocab, 11);
  // Same kernels on the same shapes: bitwise equal.
  compare(run_single(m, prompts, 4), run_tp(m, 1, prompts, 4), m.cfg.vocab, 0.0f);
}

TEST_CASE("tensor parallelism over 2 and 4 ranks matches one S-worker", "[parallel]") {
  const fd::Model m = test_model();
  const auto prompts = random_prompts({5, 1, 9}, m.cfg.vocab, 7);
  const Run single = run_single(m, prompts, kDecode);
  REQUIRE(single.tokens[0].size() == static_cast<size_t>(kDecode + 1));
  for (int g : {2, 4}) {
    INFO("ranks " << g);
    compare(single, run_tp(m, g, prompts, kDecode), m.cfg.vocab, kTpRelTol);
  }
  REQUIRE_THROWS_AS(run_tp(m, 3, prompts, 1), fd::Error);
}

TEST_CASE("pipeline parallelism over 2 and 4 stages matches one S-worker", "[parallel]") {
  const fd::Model m = test_model();
  const auto prompts = random_prompts({5, 1, 9}, m.cfg.vocab, 9);
  const Run single = run_single(m, prompts, kDecode);
  for (int g : {2, 4, 5}) {
    INFO("stages " << g);
    // Stages run the same kernels on the same shapes and hand x over as is: bitwise equal.
    compare(single, run_pp(m, g, prompts, kDecode), m.cfg.vocab, 0.0f);
  }
}

TEST_CASE("set_x checks a step like embed, backends without it say so", "[parallel]") {
  const fd::Model m = fd::make_random_model(config(1, 64, 4, 4, 128, 300), 5);
  auto backend = fd::make_cpu_backend(m);
  auto state = backend->make_state();
  const std::vector<float> x(2 * 64, 0.5f);
  fd::StepInput in;
  in.tokens = {5, 6};
  in.pos = {0};
  in.logit_rows = {1};
  REQUIRE_THROWS_AS(backend->set_x(*state, in, x.data()), fd::Error);
  in.pos = {0, 64};
  REQUIRE_THROWS_AS(backend->set_x(*state, in, x.data()), fd::Error);
  in.pos = {0, 1};
  in.logit_rows = {2};
  REQUIRE_THROWS_AS(backend->set_x(*state, in, x.data()), fd::Error);
  in.logit_rows = {1};
  backend->set_x(*state, in, x.data());
  std::vector<float> back;
  backend->get_x(*state, back);
  REQUIRE(back == x);

  class Bare : public fd::SPartBackend {
   public:
    explicit Bare(const fd::ModelConfig& c) : c_(c) {}
    const fd::ModelConfig& config() const override { return c_; }
    const char* name() const override { return "bare"; }
    std::unique_ptr<fd::SPartState> make_state() const override { return nullptr; }
    void embed(fd::SPartState&, const fd::StepInput&) const override {}
    void attn_in(fd::SPartState&, int, fd::AttnIn&) const override {}
    void attn_out(fd::SPartState&, int, const float*) const override {}
    void logits(fd::SPartState&, std::vector<float>&) const override {}

   private:
    fd::ModelConfig c_;
  };
  const Bare bare(m.cfg);
  REQUIRE_THROWS_AS(bare.get_x(*state, back), fd::Error);
  REQUIRE_THROWS_AS(bare.set_x(*state, in, x.data()), fd::Error);
}
