#include "actors/parallel_stream.h"

#include "actors/gpu_stream.h"
#include "caf/all.hpp"
#include "runtime/parallel.h"

namespace fd {
namespace {

// ---- tensor-parallel rank ---------------------------------------------------------------------

struct RankState {
  std::shared_ptr<const TpRankBackend> backend;
  std::unique_ptr<TpRankState> act;
  AttnIn qkv;
  bool lm_head = false;  // rank 0 computes the logits
  static inline const char* name = "tp_rank";
};

template <class R, class F>
caf::result<R> guarded(F f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::runtime_error, std::string("S-part rank: ") + e.what());
  }
}

s_output rank_output(RankState& st, int next_layer) {
  s_output out;
  fill_output(*st.backend, *st.act, next_layer, st.lm_head, st.qkv, out);
  return out;
}

bool rows_match(const RankState& st, const bytes& b, size_t width) {
  return b.size() == static_cast<size_t>(st.act->rows) * width * sizeof(float);
}

tp_rank_actor::behavior_type rank_behavior(tp_rank_actor::stateful_pointer<RankState> self,
                                           std::shared_ptr<const TpRankBackend> backend,
                                           bool lm_head) {
  auto& st = self->state;
  st.backend = std::move(backend);
  st.act = st.backend->make_state();
  st.lm_head = lm_head;
  const size_t dim = st.backend->config().dim;
  return {
      [self](const step_tokens& in) {
        return guarded<s_output>([&] {
          self->state.backend->embed(*self->state.act, StepInput{in.tokens, in.pos, in.logit_rows});
          return rank_output(self->state, 0);
        });
      },
      [self](const tp_proj& in) {
        return guarded<tp_partial>([&] {
          auto& st = self->state;
          if (!rows_match(st, in.o, st.backend->q_width())) throw Error("o of the wrong shape");
          std::vector<float> part;
          st.backend->attn_proj(*st.act, in.layer, as<float>(in.o), part);
          return tp_partial{to_bytes(part.data(), part.size())};
        });
      },
      [self, dim](const tp_mlp& in) {
        return guarded<tp_partial>([&] {
          auto& st = self->state;
          if (!rows_match(st, in.sum, dim)) throw Error("sum of the wrong shape");
          st.backend->add_residual(*st.act, as<float>(in.sum));
          std::vector<float> part;
          st.backend->mlp(*st.act, in.layer, part);
          return tp_partial{to_bytes(part.data(), part.size())};
        });
      },
      [self, dim](const tp_next& in) {
        return guarded<s_output>([&] {
          auto& st = self->state;
          if (!rows_match(st, in.sum, dim)) throw Error("sum of the wrong shape");
          st.backend->add_residual(*st.act, as<float>(in.sum));
          return rank_output(st, in.next_layer);
        });
      },
  };
}

// ---- tensor-parallel coordinator ----------------------------------------------------------------

struct TpState {
  ModelConfig model;
  std::vector<TpSlice> slices;
  std::vector<tp_rank_actor> ranks;
  size_t rows = 0;
  static inline const char* name = "tp_coordinator";
};

using tp_self = stream_actor::stateful_pointer<TpState>;

// Sends msgs[r] to rank r; calls done with every reply once all arrived, or delivers the first
// error to rp.
template <class Reply, class Msg, class Done>
void fan_out(tp_self self, std::vector<Msg> msgs, caf::typed_response_promise<s_output> rp,
             Done done) {
  const size_t n = msgs.size();
  auto replies = std::make_shared<std::vector<Reply>>(n);
  auto left = std::make_shared<size_t>(n);
  auto failed = std::make_shared<bool>(false);
  for (size_t r = 0; r < n; ++r)
    self->request(self->state.ranks[r], caf::infinite, std::move(msgs[r]))
        .then(
            [=](Reply& rep) mutable {
              (*replies)[r] = std::move(rep);
              if (--*left == 0 && !*failed) done(*replies);
            },
            [=](caf::error& e) mutable {
              if (!*failed) rp.deliver(std::move(e));
              *failed = true;
            });
}

// Rank slices of Q/K/V side by side, in head order, as one stream would give them.
s_output concat(const TpState& st, std::vector<s_output>& parts, int32_t next_layer) {
  s_output out;
  out.next_layer = next_layer;
  if (next_layer >= st.model.n_layers) {
    out.logits = std::move(parts[0].logits);
    return out;
  }
  const size_t hd = st.model.head_dim;
  auto join = [&](auto member, size_t elem, bool kv) {
    bytes dst;
    for (size_t row = 0; row < st.rows; ++row)
      for (size_t r = 0; r < parts.size(); ++r) {
        const size_t w = (kv ? st.slices[r].kv_heads : st.slices[r].heads) * hd * elem;
        const bytes& src = parts[r].*member;
        dst.insert(dst.end(), src.begin() + row * w, src.begin() + (row + 1) * w);
      }
    return dst;
  };
  out.q = join(&s_output::q, sizeof(float), false);
  out.k = join(&s_output::k, sizeof(uint16_t), true);
  out.v = join(&s_output::v, sizeof(uint16_t), true);
  return out;
}

bytes sum_of(std::vector<tp_partial>& parts) {
  bytes sum = std::move(parts[0].part);
  float* s = as<float>(sum);
  const size_t n = sum.size() / sizeof(float);
  for (size_t r = 1; r < parts.size(); ++r) {
    const float* p = as<float>(parts[r].part);
    for (size_t i = 0; i < n; ++i) s[i] += p[i];
  }
  return sum;
}

stream_actor::behavior_type tp_behavior(tp_self self, ModelConfig model,
                                        std::vector<std::shared_ptr<const TpRankBackend>> ranks) {
  auto& st = self->state;
  st.model = model;
  for (size_t r = 0; r < ranks.size(); ++r) {
    st.slices.push_back(ranks[r]->slice());
    st.ranks.push_back(self->system().spawn<caf::detached>(rank_behavior, ranks[r], r == 0));
    self->link_to(st.ranks.back());
  }
  return {
      [self](const step_tokens& in) -> caf::result<s_output> {
        auto rp = self->make_response_promise<s_output>();
        self->state.rows = in.tokens.size();
        fan_out<s_output>(self, std::vector<step_tokens>(self->state.ranks.size(), in), rp,
                          [self, rp](std::vector<s_output>& parts) mutable {
                            rp.deliver(concat(self->state, parts, 0));
                          });
        return rp;
      },
      [self](const layer_o& in) -> caf::result<s_output> {
        auto& st = self->state;
        const size_t hd = st.model.head_dim, qw = st.model.q_width();
        if (in.o.size() != st.rows * qw * sizeof(float))
          return caf::make_error(caf::sec::invalid_argument, "attention output of the wrong shape");
        auto rp = self->make_response_promise<s_output>();
        std::vector<tp_proj> proj(st.ranks.size());
        for (size_t r = 0; r < st.ranks.size(); ++r) {
          proj[r].layer = in.layer;
          const size_t c0 = st.slices[r].head0 * hd, w = st.slices[r].heads * hd;
          proj[r].o.resize(st.rows * w * sizeof(float));
          for (size_t row = 0; row < st.rows; ++row)
            std::copy_n(as<float>(in.o) + row * qw + c0, w, as<float>(proj[r].o) + row * w);
        }
        const int32_t layer = in.layer;
        const size_t n = st.ranks.size();
        fan_out<tp_partial>(self, std::move(proj), rp, [self, rp, layer, n](std::vector<tp_partial>& a) {
          std::vector<tp_mlp> mlp(n, tp_mlp{layer, sum_of(a)});
          fan_out<tp_partial>(self, std::move(mlp), rp, [self, rp, layer, n](std::vector<tp_partial>& m) {
            std::vector<tp_next> next(n, tp_next{layer + 1, sum_of(m)});
            fan_out<s_output>(self, std::move(next), rp,
                              [self, rp, layer](std::vector<s_output>& parts) mutable {
                                rp.deliver(concat(self->state, parts, layer + 1));
                              });
          });
        });
        return rp;
      },
  };
}

// ---- pipeline-parallel coordinator --------------------------------------------------------------

struct PpState {
  ModelConfig model;
  std::vector<stage_actor> stages;
  std::vector<r_group> groups;  // [stages] layer0 of each
  step_tokens step;             // the step in flight, for handing x to the next stage
  static inline const char* name = "pp_coordinator";
};

using pp_self = stream_actor::stateful_pointer<PpState>;

// Follows a stage's answer: Q/K/V or logits go back to the mini-batch (layer numbers made
// global), x goes on to the next stage.
void on_stage(pp_self self, size_t stage, s_output& out, caf::typed_response_promise<s_output> rp) {
  auto& st = self->state;
  if (out.x.empty()) {
    out.next_layer = out.logits.empty() ? out.next_layer + st.groups[stage].layer0 : st.model.n_layers;
    rp.deliver(std::move(out));
    return;
  }
  if (stage + 1 >= st.stages.size()) {
    rp.deliver(caf::make_error(caf::sec::runtime_error, "the last pipeline stage gave no logits"));
    return;
  }
  self->request(st.stages[stage + 1], caf::infinite, pp_enter{st.step, std::move(out.x)})
      .then([self, stage, rp](s_output& next) mutable { on_stage(self, stage + 1, next, rp); },
            [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
}

stream_actor::behavior_type pp_behavior(pp_self self, ModelConfig model,
                                        std::vector<std::shared_ptr<const SPartBackend>> stages,
                                        std::vector<r_group> groups) {
  auto& st = self->state;
  st.model = model;
  st.groups = std::move(groups);
  for (size_t s = 0; s < stages.size(); ++s) {
    st.stages.push_back(spawn_stage(self->system(), stages[s], s + 1 == stages.size()));
    self->link_to(st.stages.back());
  }
  return {
      [self](const step_tokens& in) -> caf::result<s_output> {
        auto rp = self->make_response_promise<s_output>();
        self->state.step = in;
        self->request(self->state.stages[0], caf::infinite, in)
            .then([self, rp](s_output& out) mutable { on_stage(self, 0, out, rp); },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [self](const layer_o& in) -> caf::result<s_output> {
        auto& st = self->state;
        size_t s = 0;
        while (s + 1 < st.groups.size() && in.layer >= st.groups[s + 1].layer0) ++s;
        auto rp = self->make_response_promise<s_output>();
        self->request(st.stages[s], caf::infinite, layer_o{in.layer - st.groups[s].layer0, in.o})
            .then([self, s, rp](s_output& out) mutable { on_stage(self, s, out, rp); },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
  };
}

}  // namespace

std::vector<r_group> tensor_parallel_groups(const ModelConfig& m, int g) {
  std::vector<r_group> out;
  for (int r = 0; r < g; ++r) {
    const TpSlice s = tp_slice(m, r, g);
    out.push_back(r_group{0, m.n_layers, s.head0, s.heads, s.kv_head0, s.kv_heads});
  }
  return out;
}

std::vector<r_group> pipeline_parallel_groups(const ModelConfig& m, int g) {
  std::vector<r_group> out;
  for (int s = 0; s < g; ++s) {
    const PpStage p = pp_stage(m, s, g);
    out.push_back(r_group{p.layer0, p.layers, 0, m.n_heads, 0, m.n_kv_heads});
  }
  return out;
}

stream_actor spawn_tensor_parallel(caf::actor_system& sys, const ModelConfig& m,
                                   std::vector<std::shared_ptr<const TpRankBackend>> ranks) {
  return sys.spawn(tp_behavior, m, std::move(ranks));
}

stream_actor spawn_pipeline_parallel(caf::actor_system& sys, const ModelConfig& m,
                                     std::vector<std::shared_ptr<const SPartBackend>> stages,
                                     std::vector<r_group> groups) {
  return sys.spawn(pp_behavior, m, std::move(stages), std::move(groups));
}

}  // namespace fd
