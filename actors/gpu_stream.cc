#include "actors/gpu_stream.h"

#include "caf/all.hpp"

namespace fd {
namespace {

struct StreamState {
  std::shared_ptr<const SPartBackend> backend;
  bool last = true;                 // produces logits after its last layer
  std::unique_ptr<SPartState> act;  // activations of the step in flight
  AttnIn qkv;
  size_t rows = 0;
  static inline const char* name = "gpu_stream";
};

s_output next_output(StreamState& st, int next_layer) {
  s_output out;
  if (!fill_output(*st.backend, *st.act, next_layer, st.last, st.qkv, out)) {
    std::vector<float> x;
    st.backend->get_x(*st.act, x);
    out.x = to_bytes(x.data(), x.size());
  }
  return out;
}

caf::error check_step(const ModelConfig& cfg, const step_tokens& in) {
  if (in.tokens.empty() || in.pos.size() != in.tokens.size())
    return caf::make_error(caf::sec::invalid_argument, "step has no rows or mismatched positions");
  for (size_t i = 0; i < in.tokens.size(); ++i)
    if (in.tokens[i] < 0 || in.tokens[i] >= cfg.vocab || in.pos[i] < 0 || in.pos[i] >= cfg.ctx)
      return caf::make_error(caf::sec::invalid_argument, "step token or position out of range");
  for (int32_t r : in.logit_rows)
    if (r < 0 || static_cast<size_t>(r) >= in.tokens.size())
      return caf::make_error(caf::sec::invalid_argument, "logit row out of range");
  return caf::none;
}

// Backend errors answer the request instead of killing the actor.
template <class F>
caf::result<s_output> guarded(F f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::runtime_error, std::string("S-part: ") + e.what());
  }
}

caf::result<s_output> start(StreamState& st, const step_tokens& in, const bytes* x) {
  if (auto err = check_step(st.backend->config(), in)) return err;
  return guarded([&] {
    StepInput step{in.tokens, in.pos, in.logit_rows};
    st.rows = in.tokens.size();
    if (x) {
      if (x->size() != st.rows * st.backend->config().dim * sizeof(float))
        throw Error("residual stream of the wrong shape");
      st.backend->set_x(*st.act, step, as<float>(*x));
    } else {
      st.backend->embed(*st.act, step);
    }
    return next_output(st, 0);
  });
}

caf::result<s_output> finish_layer(StreamState& st, layer_o& in) {
  const auto& cfg = st.backend->config();
  if (in.layer < 0 || in.layer >= cfg.n_layers ||
      in.o.size() != st.rows * cfg.q_width() * sizeof(float))
    return caf::make_error(caf::sec::invalid_argument, "attention output of the wrong shape");
  return guarded([&] {
    st.backend->attn_out(*st.act, in.layer, as<float>(in.o));
    // O is done with and has Q's size: the next layer's Q is written into its pages instead of
    // fresh ones that would be allocated and zeroed.
    st.qkv.q.adopt(std::move(in.o));
    return next_output(st, in.layer + 1);
  });
}

stream_actor::behavior_type stream_behavior(stream_actor::stateful_pointer<StreamState> self,
                                            std::shared_ptr<const SPartBackend> backend) {
  self->state.backend = std::move(backend);
  self->state.act = self->state.backend->make_state();
  return {
      [self](const step_tokens& in) { return start(self->state, in, nullptr); },
      [self](layer_o& in) { return finish_layer(self->state, in); },
  };
}

stage_actor::behavior_type stage_behavior(stage_actor::stateful_pointer<StreamState> self,
                                          std::shared_ptr<const SPartBackend> backend, bool last) {
  self->state.backend = std::move(backend);
  self->state.last = last;
  self->state.act = self->state.backend->make_state();
  return {
      [self](const step_tokens& in) { return start(self->state, in, nullptr); },
      [self](const pp_enter& in) { return start(self->state, in.step, &in.x); },
      [self](layer_o& in) { return finish_layer(self->state, in); },
  };
}

}  // namespace

stream_actor spawn_gpu_stream(caf::actor_system& sys, std::shared_ptr<const SPartBackend> backend) {
  return sys.spawn<caf::detached>(stream_behavior, std::move(backend));
}

stage_actor spawn_stage(caf::actor_system& sys, std::shared_ptr<const SPartBackend> backend,
                        bool last) {
  return sys.spawn<caf::detached>(stage_behavior, std::move(backend), last);
}

}  // namespace fd
