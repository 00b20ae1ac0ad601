// A simulated S-part backend: each layer takes the time a profile says a real device needs for
// the step's batch, and yields deterministic pseudo-random Q/K/V and logits of the model's shape.
// The R-part (shards, KV-cache, attention) runs for real on them, so the system can be measured
// at the pace of a GPU this machine does not have. Generated text is meaningless but
// reproducible: a row's values depend only on its token id, its position and the layer.
//
// Profile file (examples/profiles/*.txt), one item per line, `#` starts a comment:
//   model llama-7b      optional, at most once, before the entries: what was measured
//   1    0.00146        an entry: batch size (rows of a step, >= 1), then the seconds one layer's
//   1024 0.00708        S-part (attn_in + attn_out) takes; batch sizes strictly increasing
// T(B) is linear between entries and extrapolated linearly from the two nearest entries beyond
// them (never below 0); a single entry is a constant.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/spart.h"

namespace fd {

struct SimProfile {
  std::string model;            // the `model` line, or ""
  std::string source;           // where it was read from, for messages
  std::vector<int> batch;       // [entries] strictly increasing, >= 1
  std::vector<double> seconds;  // [entries] one layer's S-part latency at that batch

  // T(B) in seconds for one layer at `batch` rows.
  double layer_seconds(double batch) const;
  // The same device k times slower (k > 1) or faster; throws fd::Error unless k > 0.
  SimProfile scaled(double k) const;
};

// Throws fd::Error("NAME:LINE: problem") for malformed text; NAME is used only in messages.
SimProfile parse_sim_profile(const std::string& text, const std::string& name);
SimProfile load_sim_profile(const std::string& path);
// The profile as the file format above (a comment line naming the source first), exact enough
// that parsing it gives back the same T(B).
std::string format_sim_profile(const SimProfile& p);

// attn_in and attn_out each occupy the simulated device for T(rows)/2. attn_in returns at the end
// of that (sleep, then spin for the last ~150 µs), or later when producing the outputs takes
// longer; attn_out is queued like an asynchronous kernel launch and returns at once, and the next
// attn_in or logits on the same state waits for it.
// The device is one GPU shared by all states of the backend: calls from several threads (the
// GPU streams of both mini-batches) queue for it and run one after the other, as kernels of two
// streams do on one busy GPU. embed and logits add no delay.
// Throws fd::Error for an invalid model shape or an empty profile.
std::unique_ptr<SPartBackend> make_sim_backend(const ModelConfig& cfg, SimProfile profile);

}  // namespace fd
