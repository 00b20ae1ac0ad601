// Model parallelism of the S-part on one machine.
//
// Tensor parallelism: G ranks each hold a slice of the attention heads (with their KV heads) and
// of the MLP hidden width; x is replicated. Per layer: attn_in on every rank -> attention over
// each rank's own KV heads -> attn_proj per rank -> sum of the G partials -> add_residual on
// every rank -> mlp per rank -> sum -> add_residual on every rank.
//
// Pipeline parallelism: G stages hold consecutive layers; pp_model gives a Model a plain
// SPartBackend runs, and SPartBackend::get_x / set_x move the residual stream between stages.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/model.h"
#include "runtime/spart.h"

namespace fd {

// Rank `rank` of `size`: query heads [head0, head0+heads), KV heads [kv_head0, kv_head0+kv_heads)
// (exactly the KV heads its query heads read under GQA), MLP hidden units [ff0, ff0+ff).
struct TpSlice {
  int rank = 0, size = 1;
  int head0 = 0, heads = 0;
  int kv_head0 = 0, kv_heads = 0;
  int ff0 = 0, ff = 0;
};

// Heads and KV heads split evenly: throws fd::Error unless size divides n_heads and n_kv_heads.
// The MLP width may split unevenly: the first ff % size ranks get one unit more (needs ff >= size).
TpSlice tp_slice(const ModelConfig& cfg, int rank, int size);

// Stage `stage` of `size` holds layers [layer0, layer0+layers); the first n_layers % size stages
// get one layer more. Throws fd::Error when size > n_layers.
struct PpStage {
  int stage = 0, size = 1;
  int layer0 = 0, layers = 0;
};
PpStage pp_stage(const ModelConfig& cfg, int stage, int size);

// A copy of the stage's layers (cfg.n_layers = st.layers; layer i is model layer st.layer0 + i).
// Embedding, out_norm, output and vocabulary are copied into every stage (memory duplicated) so
// that a plain CPU backend runs it; only stage 0 needs embed and the last stage logits.
Model pp_model(const Model& model, const PpStage& st);

// Activations of one mini-batch on one TP rank.
struct TpRankState {
  int rows = 0;
  std::vector<int32_t> pos;         // [rows]
  std::vector<int32_t> logit_rows;  // [n_logit_rows]
  std::vector<float> x;             // [rows][dim] residual stream, replicated on every rank
  std::vector<float> xb;            // [rows][dim] normed input
  std::vector<float> k;             // [rows][kv_heads*head_dim]
  std::vector<float> v;             // [rows][kv_heads*head_dim]
  std::vector<float> hb;            // [rows][slice ff]
  std::vector<float> hb2;           // [rows][slice ff]
};

// One TP rank on the CPU. Holds copies of only its weight slices, plus the replicated norms,
// embedding and LM head (embedding and output are duplicated on every rank); the model need not
// outlive it. Methods are const and thread-safe across distinct states.
class TpRankBackend {
 public:
  TpRankBackend(const Model& model, const TpSlice& slice);

  const ModelConfig& config() const { return cfg_; }  // the full model's
  const TpSlice& slice() const { return slice_; }
  int q_width() const { return slice_.heads * cfg_.head_dim; }
  int kv_width() const { return slice_.kv_heads * cfg_.head_dim; }

  std::unique_ptr<TpRankState> make_state() const { return std::make_unique<TpRankState>(); }
  // x = embeddings of in.tokens; checks tokens, positions and logit rows like the CPU backend.
  void embed(TpRankState& s, const StepInput& in) const;
  // out.q [rows][q_width()] with RoPE; out.k, out.v [rows][kv_width()] fp16, K with RoPE.
  void attn_in(TpRankState& s, int layer, AttnIn& out) const;
  // partial [rows][dim] = o · Wo[:, this rank's heads]ᵀ; o: [rows][q_width()].
  void attn_proj(TpRankState& s, int layer, const float* o, std::vector<float>& partial) const;
  // x += sum; sum: [rows][dim], the sum of all ranks' partials.
  void add_residual(TpRankState& s, const float* sum) const;
  // partial [rows][dim] = W_down[:, slice] · (silu(W_gate[slice] · n) * W_up[slice] · n),
  // n = RMSNorm(x, ffn_norm).
  void mlp(TpRankState& s, int layer, std::vector<float>& partial) const;
  // Final norm and the (replicated) LM head for the step's logit_rows: [logit_rows][vocab].
  void logits(TpRankState& s, std::vector<float>& out) const;

 private:
  struct Layer {
    std::vector<float> attn_norm;  // [dim]
    std::vector<float> wq;         // [heads*head_dim][dim]
    std::vector<float> wk;         // [kv_heads*head_dim][dim]
    std::vector<float> wv;         // [kv_heads*head_dim][dim]
    std::vector<float> wo;         // [dim][heads*head_dim]
    std::vector<float> ffn_norm;   // [dim]
    std::vector<float> w_gate;     // [slice ff][dim]
    std::vector<float> w_up;       // [slice ff][dim]
    std::vector<float> w_down;     // [dim][slice ff]
  };
  const Layer& layer(int l) const;

  ModelConfig cfg_;
  TpSlice slice_;
  std::vector<float> tok_embd_;  // [vocab][dim]
  std::vector<Layer> layers_;    // [n_layers]
  std::vector<float> out_norm_;  // [dim]
  std::vector<float> output_;    // [vocab][dim]
};

}  // namespace fd
