#include "runtime/sim_backend.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "kernels/ops.h"
#include "runtime/error.h"

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;

bool parse_int(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](unsigned char ch) { return std::isdigit(ch) != 0; })) return false;
  *out = std::atoi(s.c_str());
  return true;
}

bool parse_seconds(const std::string& s, double* out) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

uint64_t mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The hash that picks a row's pseudo-random values; layer -1 stands for the logits.
uint64_t row_key(int32_t token, int32_t pos, int layer) {
  uint64_t h = mix(0x9e3779b97f4a7c15ull + static_cast<uint32_t>(token));
  h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 1));
  return mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(layer + 1)) << 33));
}

std::vector<float> uniform(uint64_t seed, size_t n) {  // in [-1, 1)
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(mix(seed + i * 0x9e3779b97f4a7c15ull) >> 40) * (1.0f / 8388608.0f) - 1.0f;
  return v;
}

// Sleeps to shortly before the deadline, then spins: sleep_until alone overshoots by the
// scheduler's wake-up latency. The thread's timer slack is cut to 1 ns (Linux's default 50 µs
// is added to every sleep): on the 2-core VM the overshoot fell from 88 to 35 µs (p50) and
// from 95-180 to 42-55 µs (p90-p99), so the spin, which takes a core from the real actors,
// can be short.
void wait_until(Clock::time_point deadline) {
  const auto margin = std::chrono::microseconds(70);
  ::prctl(PR_SET_TIMERSLACK, 1UL);
  if (Clock::now() + margin < deadline) std::this_thread::sleep_until(deadline - margin);
  while (Clock::now() < deadline) {
  }
}

class SimState : public SPartState {
 public:
  int rows = 0;
  std::vector<int32_t> tokens;      // [rows]
  std::vector<int32_t> pos;         // [rows]
  std::vector<int32_t> logit_rows;  // [n_logit_rows]
  Clock::time_point ready_at{};     // when the device finishes the work queued for this state
};

// Rows of Q/K/V and logits are copied from small pools of random rows, so a layer's outputs
// cost a memcpy per row (a hash per value would take longer than a real GPU's layer).
constexpr size_t kPool = 61;
constexpr size_t kLogitPool = 7;
constexpr float kSpike = 10.0f;  // added to one hashed vocabulary entry: greedy picks it

class SimBackend : public SPartBackend {
 public:
  SimBackend(const ModelConfig& cfg, SimProfile profile) : c_(cfg), p_(std::move(profile)) {
    const size_t qw = c_.q_width(), kw = c_.kv_width();
    q_ = uniform(1, kPool * qw);
    const std::vector<float> k = uniform(2, kPool * kw), v = uniform(3, kPool * kw);
    k_.resize(k.size());
    v_.resize(v.size());
    kernels::f32_to_f16(k.data(), k_.data(), k.size());
    kernels::f32_to_f16(v.data(), v_.data(), v.size());
    logits_ = uniform(4, kLogitPool * static_cast<size_t>(c_.vocab));
  }

  const ModelConfig& config() const override { return c_; }
  const char* name() const override { return "sim"; }
  std::unique_ptr<SPartState> make_state() const override { return std::make_unique<SimState>(); }

  void embed(SPartState& state, const StepInput& in) const override {
    SimState& s = cast(state);
    const int rows = static_cast<int>(in.tokens.size());
    check_step(c_, in);
    s.rows = rows;
    s.tokens = in.tokens;
    s.pos = in.pos;
    s.logit_rows = in.logit_rows;
  }

  void attn_in(SPartState& state, int layer, AttnIn& out) const override {
    const auto deadline = reserve(half_layer(cast(state).rows));
    SimState& s = cast(state);
    check_layer(layer);
    const size_t qw = c_.q_width(), kw = c_.kv_width(), rows = static_cast<size_t>(s.rows);
    out.q.resize(rows * qw);
    out.k.resize(rows * kw);
    out.v.resize(rows * kw);
    for (size_t r = 0; r < rows; ++r) {
      const uint64_t key = row_key(s.tokens[r], s.pos[r], layer);
      const float* q = q_.data() + (key % kPool) * qw;
      const uint16_t* k = k_.data() + ((key >> 16) % kPool) * kw;
      const uint16_t* v = v_.data() + ((key >> 32) % kPool) * kw;
      std::copy(q, q + qw, out.q.data() + r * qw);
      std::copy(k, k + kw, out.k.data() + r * kw);
      std::copy(v, v + kw, out.v.data() + r * kw);
    }
    wait_until(deadline);
  }

  // Queued on the device like an asynchronous kernel launch: nothing of it can be observed
  // before the next call on this state, which waits for it. One wake-up per hand-over instead of
  // two, so a late wake-up of this thread (a loaded machine) does not stretch the device time.
  void attn_out(SPartState& state, int layer, const float* /*o*/) const override {
    check_layer(layer);
    SimState& s = cast(state);
    s.ready_at = reserve(half_layer(s.rows));
  }

  void logits(SPartState& state, std::vector<float>& out) const override {
    SimState& s = cast(state);
    wait_until(s.ready_at);  // the last attn_out
    const size_t vocab = static_cast<size_t>(c_.vocab);
    out.resize(s.logit_rows.size() * vocab);
    for (size_t i = 0; i < s.logit_rows.size(); ++i) {
      const int32_t r = s.logit_rows[i];
      const uint64_t key = row_key(s.tokens[r], s.pos[r], -1);
      const float* src = logits_.data() + (key % kLogitPool) * vocab;
      float* dst = out.data() + i * vocab;
      std::copy(src, src + vocab, dst);
      dst[(key >> 8) % vocab] += kSpike;
    }
  }

 private:
  static SimState& cast(SPartState& state) {
    auto* s = dynamic_cast<SimState*>(&state);
    if (s == nullptr) throw Error("The simulated backend was given a state made by another backend.");
    return *s;
  }

  void check_layer(int layer) const {
    if (layer < 0 || layer >= c_.n_layers) {
      throw Error("Layer " + std::to_string(layer) + " does not exist; the model has " +
                  std::to_string(c_.n_layers) + " layers.");
    }
  }

  Clock::duration half_layer(int rows) const {
    const std::chrono::duration<double> t(0.5 * p_.layer_seconds(rows));
    return std::chrono::duration_cast<Clock::duration>(t);
  }

  // The simulated device is one GPU shared by every stream that uses this backend: a call starts
  // when the device is free (the previous call's deadline, however late its thread woke up) and
  // occupies it for d. Returns the call's deadline.
  Clock::time_point reserve(Clock::duration d) const {
    std::lock_guard<std::mutex> lock(mu_);
    free_at_ = std::max(Clock::now(), free_at_) + d;
    return free_at_;
  }

  ModelConfig c_;
  SimProfile p_;
  mutable std::mutex mu_;
  mutable Clock::time_point free_at_{};  // when the simulated device finishes its queued work
  std::vector<float> q_;          // [kPool][q_width]
  std::vector<uint16_t> k_, v_;   // [kPool][kv_width] fp16
  std::vector<float> logits_;     // [kLogitPool][vocab]
};

}  // namespace

double SimProfile::layer_seconds(double b) const {
  const size_t n = batch.size();
  if (n == 0) return 0.0;
  if (n == 1) return seconds[0];
  size_t i = 0;  // the segment [i, i+1] that holds b, or the nearest one
  if (b >= batch[n - 1]) {
    i = n - 2;
  } else {
    while (i + 2 < n && b >= batch[i + 1]) ++i;
  }
  const double b0 = batch[i], b1 = batch[i + 1];
  const double t = seconds[i] + (b - b0) * (seconds[i + 1] - seconds[i]) / (b1 - b0);
  return std::max(0.0, t);
}

SimProfile SimProfile::scaled(double k) const {
  if (!(k > 0) || !std::isfinite(k))
    throw Error("An S-part profile can only be scaled by a positive factor, not " + std::to_string(k) + ".");
  SimProfile p = *this;
  for (double& s : p.seconds) s *= k;
  return p;
}

std::string format_sim_profile(const SimProfile& p) {
  std::ostringstream out;
  out.precision(17);
  out << "# S-part profile" << (p.source.empty() ? "" : " from " + p.source) << "\n";
  if (!p.model.empty()) out << "model " << p.model << "\n";
  for (size_t i = 0; i < p.batch.size(); ++i) out << p.batch[i] << " " << p.seconds[i] << "\n";
  return out.str();
}

SimProfile parse_sim_profile(const std::string& text, const std::string& name) {
  SimProfile p;
  p.source = name;
  std::istringstream in(text);
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    const std::string where = name + ":" + std::to_string(no) + ": ";
    line = line.substr(0, line.find('#'));
    std::istringstream ls(line);
    std::vector<std::string> f;
    for (std::string w; ls >> w;) f.push_back(w);
    if (f.empty()) continue;
    if (f[0] == "model") {
      if (f.size() < 2) throw Error(where + "the model line needs a name, as in 'model llama-7b'.");
      if (!p.model.empty()) throw Error(where + "the profile names its model twice.");
      if (!p.batch.empty()) throw Error(where + "the model line must come before the entries.");
      const size_t at = line.find_first_not_of(" \t", line.find("model") + 5);
      p.model = line.substr(at, line.find_last_not_of(" \t\r") + 1 - at);
      continue;
    }
    int b = 0;
    double s = 0;
    if (f.size() != 2 || !parse_int(f[0], &b) || !parse_seconds(f[1], &s)) {
      throw Error(where + "expected 'BATCH SECONDS' (a batch size and one layer's S-part latency "
                          "in seconds) or 'model NAME', got '" + line + "'.");
    }
    if (b < 1) throw Error(where + "the batch size must be at least 1.");
    if (s < 0) throw Error(where + "the latency may not be negative.");
    if (!p.batch.empty() && b <= p.batch.back()) {
      throw Error(where + "batch sizes must increase from line to line, but " + std::to_string(b) +
                  " follows " + std::to_string(p.batch.back()) + ".");
    }
    p.batch.push_back(b);
    p.seconds.push_back(s);
  }
  if (p.batch.empty()) throw Error(name + ": the S-part profile has no 'BATCH SECONDS' entries.");
  return p;
}

SimProfile load_sim_profile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot read this S-part profile file.");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_sim_profile(ss.str(), path);
}

std::unique_ptr<SPartBackend> make_sim_backend(const ModelConfig& cfg, SimProfile profile) {
  ModelConfig c = cfg;
  if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  if (c.head_dim == 0 && c.n_heads > 0) c.head_dim = c.dim / c.n_heads;
  if (c.n_layers < 1 || c.n_heads < 1 || c.head_dim < 1 || c.vocab < 1 || c.n_kv_heads < 1 ||
      c.n_heads % c.n_kv_heads != 0) {
    throw Error("The simulated backend needs a model with layers, heads, a head size and a vocabulary, "
                "and a head count that is a multiple of the KV head count.");
  }
  if (profile.batch.empty() || profile.batch.size() != profile.seconds.size())
    throw Error("The simulated backend needs an S-part profile with at least one entry.");
  return std::make_unique<SimBackend>(c, std::move(profile));
}

}  // namespace fd
