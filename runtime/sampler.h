// Next-token choice. Each sequence owns its generator, so a seed gives the same text whatever
// the batch it runs in or the shard that holds it.
#pragma once
#include <cstdint>
#include <vector>

namespace fd {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 40;            // <= 0: no limit
  float top_p = 0.95f;       // >= 1: no limit
  uint64_t seed = 0;
};

// Throws fd::Error when temperature < 0, top_p is outside (0, 1], or a value is not finite.
void validate(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [vocab]. Greedy picks the lowest index among equal maxima.
  int32_t sample(const float* logits, int vocab);
  const SamplingParams& params() const { return p_; }

 private:
  double uniform();  // [0, 1), 53 bits, from the splitmix64/xoshiro stream below
  SamplingParams p_;
  uint64_t s_[4];
  std::vector<std::pair<float, int32_t>> scratch_;  // [vocab] (logit, token) candidates
  std::vector<double> weights_;                     // [top_k] unnormalised softmax weights
};

}  // namespace fd
