// The S-part: all dense work of a step, shared by every sequence of a mini-batch. A backend
// (CPU now, CUDA later) runs it layer by layer; attention (the R-part) happens elsewhere
// between attn_in and attn_out.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/model.h"

namespace fd {

// One forward step of a mini-batch: rows are tokens, grouped by sequence.
struct StepInput {
  std::vector<int32_t> tokens;      // [rows]
  std::vector<int32_t> pos;         // [rows] position of each token in its sequence
  std::vector<int32_t> logit_rows;  // rows whose next-token logits are wanted
};

// An array of T held as raw bytes: the bytes move into a message as they are. Copying Q/K/V out
// of typed vectors was 1 MiB per layer (32 rows, 7B shape) between the end of the S-part and the
// shards' start, on the pipeline's critical path.
template <class T>
class TypedBytes {
 public:
  void resize(size_t n) { b_.resize(n * sizeof(T)); }
  size_t size() const { return b_.size() / sizeof(T); }
  bool empty() const { return b_.empty(); }
  T* data() { return reinterpret_cast<T*>(b_.data()); }
  const T* data() const { return reinterpret_cast<const T*>(b_.data()); }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  bool operator==(const TypedBytes& o) const { return b_ == o.b_; }
  bool operator!=(const TypedBytes& o) const { return b_ != o.b_; }
  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }
  // Hands the bytes over and leaves the array empty.
  std::vector<char> release() { return std::exchange(b_, {}); }
  // Takes over b's storage, contents and all: a later resize to the same size then neither
  // allocates nor zero-fills.
  void adopt(std::vector<char>&& b) { b_ = std::move(b); }

 private:
  std::vector<char> b_;  // malloc's alignment (16) suits float and uint16_t
};

// What the R-part needs for one layer.
struct AttnIn {
  TypedBytes<float> q;     // [rows][n_heads*head_dim], RoPE applied
  TypedBytes<uint16_t> k;  // [rows][n_kv_heads*head_dim] fp16, RoPE applied
  TypedBytes<uint16_t> v;  // [rows][n_kv_heads*head_dim] fp16
};

// Activations of one step in flight; each backend defines its own.
class SPartState {
 public:
  virtual ~SPartState() = default;
};

class SPartBackend {
 public:
  virtual ~SPartBackend() = default;
  virtual const ModelConfig& config() const = 0;
  virtual const char* name() const = 0;
  // A fresh state; one per mini-batch in flight.
  virtual std::unique_ptr<SPartState> make_state() const = 0;
  // Embeds the step's tokens (the residual stream x).
  virtual void embed(SPartState& s, const StepInput& in) const = 0;
  // Layer `layer` up to attention: x -> RMSNorm -> Q, K, V -> RoPE.
  virtual void attn_in(SPartState& s, int layer, AttnIn& out) const = 0;
  // Layer `layer` after attention: x += Wo·o; x += MLP(RMSNorm(x)). o: [rows][n_heads*head_dim].
  virtual void attn_out(SPartState& s, int layer, const float* o) const = 0;
  // Final norm and LM head for the step's logit_rows: [logit_rows][vocab].
  virtual void logits(SPartState& s, std::vector<float>& out) const = 0;
  // Pipeline parallelism: the residual stream handed from one stage (a backend over consecutive
  // layers, see runtime/parallel.h) to the next. get_x copies x out: [rows][dim].
  virtual void get_x(const SPartState& /*s*/, std::vector<float>& /*x*/) const {
    throw Error(std::string("The ") + name() +
                " backend cannot hand its residual stream to a pipeline stage.");
  }
  // Starts a step like embed (positions and logit_rows from in, checked alike) but takes the
  // residual stream x [in.tokens.size()][dim] from the previous stage instead of embedding tokens.
  virtual void set_x(SPartState& /*s*/, const StepInput& /*in*/, const float* /*x*/) const {
    throw Error(std::string("The ") + name() +
                " backend cannot take a residual stream from a pipeline stage.");
  }
};

// Throws fd::Error unless every token is in the vocabulary, every position inside the context,
// there is one position per token and every logit row is a row of the step. Every backend
// checks its steps with it.
void check_step(const ModelConfig& cfg, const StepInput& in);

// The CPU backend over a host model; the model must outlive it.
std::unique_ptr<SPartBackend> make_cpu_backend(const Model& model);

}  // namespace fd
