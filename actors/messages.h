// Every message the actors exchange. Tensor payloads travel as `bytes` (std::vector<char>), which
// CAF serializes as one raw block; typed vectors such as vector<uint16_t> would go element by element.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "caf/atom.hpp"
#include "caf/error.hpp"
#include "caf/binary_deserializer.hpp"
#include "caf/meta/type_name.hpp"
#include "caf/replies_to.hpp"
#include "caf/serializer_impl.hpp"
#include "caf/typed_actor.hpp"
#include "runtime/tensor_memory.h"

namespace fd {

using bytes = std::vector<char>;

// Built from the range: one pass over the data (sizing first would zero every byte first).
template <class T>
bytes to_bytes(const T* data, size_t n) {
  const char* p = reinterpret_cast<const char*>(data);
  return bytes(p, p + n * sizeof(T));
}
template <class T>
const T* as(const bytes& b) { return reinterpret_cast<const T*>(b.data()); }
template <class T>
T* as(bytes& b) { return reinterpret_cast<T*>(b.data()); }

using drop_atom = caf::atom_constant<caf::atom("drop")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using admitted_atom = caf::atom_constant<caf::atom("admitted")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using lost_atom = caf::atom_constant<caf::atom("lost")>;
using rows_atom = caf::atom_constant<caf::atom("rows")>;
using add_atom = caf::atom_constant<caf::atom("add")>;
using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using vocab_atom = caf::atom_constant<caf::atom("vocab")>;
using lane_atom = caf::atom_constant<caf::atom("lane")>;
using expire_atom = caf::atom_constant<caf::atom("expire")>;
using sweep_atom = caf::atom_constant<caf::atom("sweep")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;

// Bumped whenever a message changes: nodes of different versions refuse each other.
constexpr int32_t kProtocolVersion = 5;

// Rows [row0, row0 + n) of a payload belong to sequence seq at positions [pos0, pos0 + n).
struct seq_rows {
  uint64_t seq = 0;
  int32_t pos0 = 0;
  int32_t n = 0;
};

// Micro-batch -> R-worker shard, per layer: append K/V of the rows, then attend with Q.
struct attn_request {
  uint64_t step = 0;
  int32_t layer = 0;
  std::vector<seq_rows> seqs;
  bytes q;  // [rows][n_heads*head_dim] f32
  bytes k;  // [rows][n_kv_heads*head_dim] f16
  bytes v;  // [rows][n_kv_heads*head_dim] f16
};

// R-worker shard -> mini-batch.
struct attn_reply {
  uint64_t step = 0;
  int32_t layer = 0;
  bytes o;                 // [rows][n_heads*head_dim] f32
  int64_t compute_us = 0;  // time the shard spent on the request (append + attention)
};

struct shard_stats {
  std::string name;
  uint64_t sequences = 0;
  uint64_t tokens = 0;       // cached tokens over all sequences (layer 0)
  uint64_t used_pages = 0;
  uint64_t free_pages = 0;
  uint64_t page_bytes = 0;
  double busy_ms = 0;        // attention time since start
  uint64_t requests = 0;
  uint64_t served = 0;       // distinct sequences since start
};

// Scheduler -> anyone: what it holds now.
struct sched_stats {
  int32_t shards = 0;    // serving (not leaving)
  uint64_t queued = 0;   // waiting for room or a shard
  uint64_t live = 0;     // admitted and not finished
};

// Micro-batch -> GPU stream: start a forward step (embed, then layer 0 up to attention).
struct step_tokens {
  std::vector<int32_t> tokens;      // [rows]
  std::vector<int32_t> pos;         // [rows]
  std::vector<int32_t> logit_rows;  // rows whose logits are wanted
};

// Micro-batch -> GPU stream: attention output of one layer.
struct layer_o {
  int32_t layer = 0;
  bytes o;  // [rows][n_heads*head_dim] f32
};

// GPU stream -> micro-batch: the next layer's Q/K/V, or the logits once next_layer == n_layers.
struct s_output {
  int32_t next_layer = 0;
  bytes q;       // [rows][n_heads*head_dim] f32
  bytes k;       // [rows][n_kv_heads*head_dim] f16
  bytes v;       // [rows][n_kv_heads*head_dim] f16
  bytes logits;  // [logit_rows][vocab] f32
  bytes x;       // [rows][dim] f32 residual stream for the next pipeline stage (when no Q/K/V)
};

// Model parallelism, coordinator -> pipeline stage: start the stage's first layer from the
// previous stage's residual stream.
struct pp_enter {
  step_tokens step;
  bytes x;  // [rows][dim] f32
};

// Coordinator -> tensor-parallel rank: Wo slice times this rank's heads of the attention output.
struct tp_proj {
  int32_t layer = 0;
  bytes o;  // [rows][rank heads*head_dim] f32
};

// Coordinator -> tensor-parallel rank: x += the summed attention projections, then the MLP slice.
struct tp_mlp {
  int32_t layer = 0;
  bytes sum;  // [rows][dim] f32
};

// Coordinator -> tensor-parallel rank: x += the summed MLP outputs, then the next layer's Q/K/V
// slice (or the logits, on rank 0, after the last layer).
struct tp_next {
  int32_t next_layer = 0;
  bytes sum;  // [rows][dim] f32
};

// Tensor-parallel rank -> coordinator: its addend of an all-reduce.
struct tp_partial {
  bytes part;  // [rows][dim] f32
};

// One event for the tracing console, shaped like a Chrome Trace Event: a span ('X') of dur_us
// on the track of one actor, or a counter ('C') whose values are in args.
struct trace_event {
  std::string track;              // the actor on its node, e.g. "mini_batch-0", "shard 3"
  std::string kind;               // actor kind: scheduler, mini_batch, micro_batch, gpu_stream, shard
  std::string node;               // the node it lives on: a cpu node's --name, "local" (gpu node)
  std::string name;               // e.g. "step", "S", "R", "load"
  char ph = 'X';
  int64_t ts_us = 0;              // microseconds on the emitting node's steady clock
  int64_t dur_us = 0;
  std::string detail;             // free text, e.g. the shard's node-qualified name
  std::vector<std::string> arg_names;
  std::vector<double> arg_values;
};

// Microseconds on this node's steady clock, the time base of trace events.
int64_t trace_now_us();

// Scheduler -> trace subscribers: the events of one snapshot (counters, once a second).
struct trace_batch {
  std::vector<trace_event> events;
};

// Mini-batch -> scheduler -> trace subscribers: the spans of the steps of up to kTraceFlush, as
// PackedSpan records (actors/trace_packed.h); the scheduler adds the node of each shard.
struct trace_packed {
  bytes spans;                           // [n] PackedSpan
  std::vector<int32_t> shard_ids;        // the scheduler's shard ids
  std::vector<std::string> shard_nodes;  // [shard_ids] the node each lives on
};

// A tracing console's actor.
using trace_sink = caf::typed_actor<caf::reacts_to<trace_batch>, caf::reacts_to<trace_packed>>;

// Scheduler -> client: one generated token, sent as soon as it is sampled.
struct token_event {
  uint64_t tag = 0;   // the request's tag
  int32_t token = 0;
};

// A client's actor that receives streamed tokens.
using token_sink = caf::typed_actor<caf::reacts_to<token_event>>;

// Client -> scheduler: one prompt to complete.
struct gen_request {
  std::vector<int32_t> prompt;  // token ids, BOS included
  int32_t max_new = 0;          // tokens to generate at most
  float temperature = 0;
  int32_t top_k = 0;
  float top_p = 1;
  uint64_t seed = 0;
  bool want_logits = false;     // return the logits of every generated token
  uint64_t tag = 0;             // the client's name for the request (streaming, cancel)
  token_sink sink;              // receives each token as it is sampled; may be null
};

// Scheduler -> client.
struct gen_result {
  std::vector<int32_t> tokens;  // generated ids only
  int32_t n_prompt = 0;
  double ms = 0;                // from admission to the last token
  double ttft_ms = 0;           // from admission to the first generated token
  std::string error;            // empty on success
  bytes logits;                 // [sampled][vocab] f32 when asked for; a final EOS counts
};

// CPU node -> gatekeeper: first step of joining.
struct join_request {
  std::string token;  // cluster secret
  int32_t version = kProtocolVersion;
  std::string node;   // the joining node's name, for logs
  int32_t group = 0;  // the R-group its shards serve (model parallelism)
};

// Gatekeeper -> CPU node: what its shards must hold (the layers and heads of its R-group).
struct join_reply {
  uint64_t run_id = 0;  // this gpu node's run; shards registered under another run are refused
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_tokens = 0;
  int32_t group = 0;
  int32_t lane_port = 0;  // the gpu node's data lane, on the host joined (actors/data_lane.h)
  // The most sequences that hold KV at once (--max-batch) and the most tokens each holds (the
  // model's context): what a cpu node without --kv-memory sizes its KV-cache by.
  int32_t max_seqs = 0;
  int32_t seq_tokens = 0;
};

// The layers and heads one R-group of shards holds: all of them without model parallelism, a
// head slice per tensor-parallel rank, a layer range per pipeline stage.
struct r_group {
  int32_t layer0 = 0;
  int32_t layers = 0;
  int32_t head0 = 0;
  int32_t heads = 0;
  int32_t kv_head0 = 0;
  int32_t kv_heads = 0;
};

// Client -> gatekeeper: access to the scheduler.
struct client_hello {
  std::string token;
  int32_t version = kProtocolVersion;
};

// Gatekeeper -> client: the model's tokenizer vocabulary, so clients need no model file.
struct vocab_msg {
  std::vector<std::string> pieces;  // [n_vocab]
  std::vector<float> scores;        // [n_vocab]
  std::vector<int32_t> types;       // [n_vocab] TokenType values
  int32_t bos = 1;
  int32_t eos = 2;
  int32_t unk = 0;
  bool add_bos = true;
  bool add_space_prefix = true;
};

// CPU node -> gpu node, first frame on its data lane (actors/data_lane.h).
struct lane_hello {
  std::string token;  // cluster secret
  int32_t version = kProtocolVersion;
  uint64_t run_id = 0;  // from join_reply
  uint64_t key = 0;     // random; the node's add_shards names its lane by it
  std::string node;     // for logs
};

// Data lane reader thread -> its actor: the connection ended.
struct lane_closed {
  std::string why;
};

// Micro-batch -> scheduler: new homes for sequences whose shard was lost or is leaving.
struct replace_request {
  std::vector<uint64_t> seqs;
};

// Micro-batch -> scheduler: a sequence left the batch (finished or failed).
struct seq_done {
  uint64_t seq = 0;
  gen_result result;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, seq_rows& x) {
  return f(caf::meta::type_name("seq_rows"), x.seq, x.pos0, x.n);
}
// Tensor payloads that cross nodes. On the wire each is exactly a `bytes` (length, then one raw
// block), but CAF's buffers for them are sized at once, with the huge-page hint (reserve_huge).

// Saving: room for `n` more bytes in CAF's output buffer, reserved once for the whole message.
template <class Inspector>
void reserve_wire(Inspector& f, size_t n) {
  if constexpr (std::is_base_of<caf::serializer, Inspector>::value) {
    if (n < 2 * kHugePage) return;
    if (auto* s = dynamic_cast<caf::serializer_impl<bytes>*>(&f))
      reserve_huge(s->buf(), s->buf().size() + n);
  }
}

struct wire_payload {
  bytes& b;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wire_payload& x) {
  if constexpr (Inspector::reads_state) {
    return f(x.b);
  } else {
    size_t n = 0;
    if (auto err = f.begin_sequence(n)) return err;
    if (n >= 2 * kHugePage) {
      x.b.clear();
      reserve_huge(x.b, n);
    }
    if (auto* bin = dynamic_cast<caf::binary_deserializer*>(&f); bin != nullptr && n <= bin->remaining()) {
      // Copied straight from the wire buffer: resize() would first zero every byte.
      const auto* p = reinterpret_cast<const char*>(bin->remainder().data());
      x.b.assign(p, p + n);
      bin->skip(n);
    } else {
      x.b.resize(n);
      if (n > 0)
        if (auto err = f.apply_raw(n, x.b.data())) return err;
    }
    return f.end_sequence();
  }
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, attn_request& x) {
  if constexpr (Inspector::reads_state) reserve_wire(f, x.q.size() + x.k.size() + x.v.size() + 256);
  return f(caf::meta::type_name("attn_request"), x.step, x.layer, x.seqs, wire_payload{x.q},
           wire_payload{x.k}, wire_payload{x.v});
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, attn_reply& x) {
  if constexpr (Inspector::reads_state) reserve_wire(f, x.o.size() + 64);
  return f(caf::meta::type_name("attn_reply"), x.step, x.layer, wire_payload{x.o}, x.compute_us);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_stats& x) {
  return f(caf::meta::type_name("shard_stats"), x.name, x.sequences, x.tokens, x.used_pages,
           x.free_pages, x.page_bytes, x.busy_ms, x.requests, x.served);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sched_stats& x) {
  return f(caf::meta::type_name("sched_stats"), x.shards, x.queued, x.live);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_tokens& x) {
  return f(caf::meta::type_name("step_tokens"), x.tokens, x.pos, x.logit_rows);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_o& x) {
  return f(caf::meta::type_name("layer_o"), x.layer, x.o);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, s_output& x) {
  return f(caf::meta::type_name("s_output"), x.next_layer, x.q, x.k, x.v, x.logits, x.x);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trace_event& x) {
  return f(caf::meta::type_name("trace_event"), x.track, x.kind, x.node, x.name, x.ph, x.ts_us,
           x.dur_us, x.detail, x.arg_names, x.arg_values);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trace_batch& x) {
  return f(caf::meta::type_name("trace_batch"), x.events);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trace_packed& x) {
  return f(caf::meta::type_name("trace_packed"), x.spans, x.shard_ids, x.shard_nodes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_event& x) {
  return f(caf::meta::type_name("token_event"), x.tag, x.token);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pp_enter& x) {
  return f(caf::meta::type_name("pp_enter"), x.step, x.x);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tp_proj& x) {
  return f(caf::meta::type_name("tp_proj"), x.layer, x.o);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tp_mlp& x) {
  return f(caf::meta::type_name("tp_mlp"), x.layer, x.sum);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tp_next& x) {
  return f(caf::meta::type_name("tp_next"), x.next_layer, x.sum);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tp_partial& x) {
  return f(caf::meta::type_name("tp_partial"), x.part);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, gen_request& x) {
  return f(caf::meta::type_name("gen_request"), x.prompt, x.max_new, x.temperature, x.top_k,
           x.top_p, x.seed, x.want_logits, x.tag, x.sink);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, gen_result& x) {
  return f(caf::meta::type_name("gen_result"), x.tokens, x.n_prompt, x.ms, x.ttft_ms, x.error, x.logits);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_request& x) {
  return f(caf::meta::type_name("join_request"), x.token, x.version, x.node, x.group);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_reply& x) {
  return f(caf::meta::type_name("join_reply"), x.run_id, x.n_layers, x.n_heads, x.n_kv_heads,
           x.head_dim, x.block_tokens, x.group, x.lane_port, x.max_seqs, x.seq_tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lane_hello& x) {
  return f(caf::meta::type_name("lane_hello"), x.token, x.version, x.run_id, x.key, x.node);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lane_closed& x) {
  return f(caf::meta::type_name("lane_closed"), x.why);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, r_group& x) {
  return f(caf::meta::type_name("r_group"), x.layer0, x.layers, x.head0, x.heads, x.kv_head0,
           x.kv_heads);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, client_hello& x) {
  return f(caf::meta::type_name("client_hello"), x.token, x.version);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vocab_msg& x) {
  return f(caf::meta::type_name("vocab_msg"), x.pieces, x.scores, x.types, x.bos, x.eos, x.unk,
           x.add_bos, x.add_space_prefix);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replace_request& x) {
  return f(caf::meta::type_name("replace_request"), x.seqs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, seq_done& x) {
  return f(caf::meta::type_name("seq_done"), x.seq, x.result);
}

}  // namespace fd
