#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/error.h"

namespace fd {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

int32_t argmax(const float* logits, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

}  // namespace

void validate(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    throw Error("Sampling temperature must be a finite number >= 0 (0 means greedy), got " +
                std::to_string(p.temperature) + ".");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    throw Error("Sampling top_p must lie in (0, 1] (1 means no nucleus cut), got " +
                std::to_string(p.top_p) + ".");
  }
}

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  validate(p_);
  uint64_t sm = p_.seed;
  for (uint64_t& word : s_) word = splitmix64(sm);
}

double Sampler::uniform() {
  // xoshiro256**
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return static_cast<double>(result >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(const float* logits, int vocab) {
  if (vocab <= 0) throw Error("Cannot sample from an empty vocabulary.");
  if (p_.temperature == 0.0f) return argmax(logits, vocab);

  // Candidates by logit descending, ties by index ascending; only the top k are ordered.
  scratch_.resize(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) throw Error("Cannot sample: the logits contain NaN.");
    scratch_[i] = {logits[i], i};
  }
  const auto before = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const int k = (p_.top_k <= 0 || p_.top_k > vocab) ? vocab : p_.top_k;
  if (k == vocab) {
    std::sort(scratch_.begin(), scratch_.end(), before);  // introsort beats a full heap sort
  } else {
    std::partial_sort(scratch_.begin(), scratch_.begin() + k, scratch_.end(), before);
  }

  // Unnormalised softmax weights in place of the logits; the first is the maximum.
  const double inv_t = 1.0 / static_cast<double>(p_.temperature);
  const double top = scratch_[0].first;
  std::vector<double>& w = weights_;
  w.resize(static_cast<size_t>(k));
  double total = 0.0;
  for (int i = 0; i < k; ++i) {
    w[i] = std::exp((static_cast<double>(scratch_[i].first) - top) * inv_t);
    total += w[i];
  }

  // Nucleus: the smallest prefix whose probability reaches top_p (at least one candidate).
  int n = k;
  if (p_.top_p < 1.0f) {
    const double target = static_cast<double>(p_.top_p) * total;
    double cum = 0.0;
    for (int i = 0; i < k; ++i) {
      cum += w[i];
      if (cum >= target) {
        n = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (int i = 0; i < n; ++i) kept += w[i];

  const double u = uniform() * kept;
  double cum = 0.0;
  for (int i = 0; i < n; ++i) {
    cum += w[i];
    if (u < cum) return scratch_[i].second;
  }
  return scratch_[n - 1].second;  // u within rounding of kept
}

}  // namespace fd
