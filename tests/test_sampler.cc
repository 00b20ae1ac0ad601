#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/error.h"
#include "runtime/sampler.h"

namespace {

std::vector<float> random_logits(std::mt19937& rng, int vocab) {
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& x : l) x = dist(rng);
  return l;
}

int first_argmax(const std::vector<float>& l) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(l.size()); ++i) {
    if (l[i] > l[best]) best = i;
  }
  return best;
}

fd::SamplingParams params(float temperature, int top_k, float top_p, uint64_t seed) {
  fd::SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

// Pearson's statistic of observed counts against expected probabilities.
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int draws) {
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * draws;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

}  // namespace

TEST_CASE("greedy sampling picks the argmax, lowest index on ties", "[sampler]") {
  std::mt19937 rng(7);
  fd::Sampler s(params(0.0f, 40, 0.95f, 123));
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> l = random_logits(rng, 100 + trial);
    REQUIRE(s.sample(l.data(), static_cast<int>(l.size())) == first_argmax(l));
  }
  const std::vector<float> tie = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  REQUIRE(s.sample(tie.data(), 5) == 1);
  const std::vector<float> neg = {-3.0f, -2.0f, -2.5f};
  REQUIRE(s.sample(neg.data(), 3) == 1);
}

TEST_CASE("a seed fixes the sampled sequence", "[sampler]") {
  std::mt19937 rng(11);
  std::vector<std::vector<float>> steps;
  for (int i = 0; i < 200; ++i) steps.push_back(random_logits(rng, 64));
  const auto run = [&](uint64_t seed) {
    fd::Sampler s(params(1.0f, 20, 0.9f, seed));
    std::vector<int32_t> out;
    for (const auto& l : steps) out.push_back(s.sample(l.data(), 64));
    return out;
  };
  const std::vector<int32_t> a = run(42);
  REQUIRE(run(42) == a);
  // 200 draws with several plausible tokens each: distinct seeds cannot agree on all of them.
  REQUIRE(run(43) != a);
}

TEST_CASE("each sampled token consumes exactly one uniform draw", "[sampler]") {
  // With two equal logits, token 1 is picked iff the draw u >= 0.5: a window onto the stream.
  const std::vector<float> coin = {0.0f, 0.0f};
  std::mt19937 rng(5);
  const std::vector<float> big = random_logits(rng, 500);
  const int n = 64;
  fd::Sampler only_coins(params(1.0f, 0, 1.0f, 99));
  std::vector<int32_t> bits;
  for (int i = 0; i < n; ++i) bits.push_back(only_coins.sample(coin.data(), 2));

  // Same seed; every odd draw uses a 500-token vocabulary instead. The even draws must see the
  // same stream positions, hence the same coins.
  fd::Sampler mixed(params(1.0f, 0, 1.0f, 99));
  for (int i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      REQUIRE(mixed.sample(coin.data(), 2) == bits[i]);
    } else {
      mixed.sample(big.data(), 500);
    }
  }
}

TEST_CASE("sampled frequencies follow the tempered, truncated softmax", "[sampler]") {
  const std::vector<float> logits = {1.0f, 2.5f, 0.0f, 2.0f, -1.0f, 1.5f};
  const int draws = 40000;
  // With a fixed seed the result is deterministic; each bound is the chi-square 0.999 quantile
  // for (kept tokens - 1) degrees of freedom: 20.5 (5), 18.5 (4), 10.8 (1), 13.8 (2).
  struct Case {
    float temperature;
    int top_k;
    float top_p;
    std::vector<int> kept;  // token ids that may be drawn, most probable first
    double bound;
  };
  const std::vector<Case> cases = {
      {1.0f, 0, 1.0f, {1, 3, 5, 0, 2, 4}, 20.5},
      {2.0f, 5, 1.0f, {1, 3, 5, 0, 2}, 18.5},
      // T = 0.5: probabilities of tokens 1, 3, 5, ... are 0.641, 0.236, 0.087, ...; top_p 0.8
      // keeps tokens 1 and 3 (cumulative 0.641 < 0.8 <= 0.877).
      {0.5f, 0, 0.8f, {1, 3}, 10.8},
      {1.0f, 3, 1.0f, {1, 3, 5}, 13.8},
  };
  for (const Case& c : cases) {
    double total = 0.0;
    std::vector<double> probs;
    for (int id : c.kept) {
      probs.push_back(std::exp((static_cast<double>(logits[id]) - logits[1]) / c.temperature));
      total += probs.back();
    }
    for (double& p : probs) p /= total;

    fd::Sampler s(params(c.temperature, c.top_k, c.top_p, 2024));
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < draws; ++i) ++counts[s.sample(logits.data(), static_cast<int>(logits.size()))];
    std::vector<int> kept_counts;
    int kept_total = 0;
    for (int id : c.kept) {
      kept_counts.push_back(counts[id]);
      kept_total += counts[id];
    }
    REQUIRE(kept_total == draws);  // nothing outside top-k / top-p
    REQUIRE(chi_square(kept_counts, probs, draws) < c.bound);
  }
}

TEST_CASE("top_k 1 and a tiny top_p reduce sampling to greedy", "[sampler]") {
  std::mt19937 rng(3);
  fd::Sampler k1(params(1.5f, 1, 1.0f, 1));
  fd::Sampler tiny_p(params(1.5f, 0, 1e-6f, 2));
  for (int trial = 0; trial < 100; ++trial) {
    const std::vector<float> l = random_logits(rng, 256);
    const int32_t best = first_argmax(l);
    REQUIRE(k1.sample(l.data(), 256) == best);
    REQUIRE(tiny_p.sample(l.data(), 256) == best);
  }
}

TEST_CASE("invalid sampling parameters are rejected", "[sampler]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float t : {-0.1f, nan, inf}) {
    REQUIRE_THROWS_AS(fd::validate(params(t, 40, 0.9f, 0)), fd::Error);
    REQUIRE_THROWS_AS(fd::Sampler(params(t, 40, 0.9f, 0)), fd::Error);
  }
  for (float p : {0.0f, -0.5f, 1.01f, nan}) {
    REQUIRE_THROWS_AS(fd::validate(params(0.7f, 40, p, 0)), fd::Error);
  }
  REQUIRE_THROWS_WITH(fd::validate(params(-1.0f, 40, 0.9f, 0)), Catch::Contains("temperature"));
  REQUIRE_THROWS_WITH(fd::validate(params(1.0f, 40, 2.0f, 0)), Catch::Contains("top_p"));
  REQUIRE_NOTHROW(fd::validate(params(0.0f, 0, 1.0f, 0)));
  REQUIRE_NOTHROW(fd::validate(params(0.8f, -1, 0.5f, 0)));

  fd::Sampler s(params(1.0f, 0, 1.0f, 0));
  const std::vector<float> bad = {0.0f, nan, 1.0f};
  REQUIRE_THROWS_AS(s.sample(bad.data(), 3), fd::Error);
  REQUIRE_THROWS_AS(s.sample(bad.data(), 0), fd::Error);
}
