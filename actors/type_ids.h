// The typed actor interfaces, the messages that carry actor handles, and the one CAF type-ID
// block of the project. A type missing here fails between nodes with `unexpected_message`.
#pragma once
#include "actors/messages.h"
#include "caf/actor_system_config.hpp"
#include "caf/type_id.hpp"
#include "caf/typed_actor.hpp"

namespace fd {

// R-worker shard: owns the KV-cache of its sequences and computes their attention.
using shard_actor = caf::typed_actor<
    caf::replies_to<attn_request>::with<attn_reply>,  // append K/V of the rows, attend, return O
    caf::reacts_to<drop_atom, uint64_t>,              // free a sequence's KV-cache
    caf::replies_to<stats_atom>::with<shard_stats>>;  // occupancy and time spent

// GPU stream: drives the S-part backend for one mini-batch in flight (or, with model
// parallelism, coordinates the S-workers that do).
using stream_actor = caf::typed_actor<
    caf::replies_to<step_tokens>::with<s_output>,  // embed, then layer 0 up to attention
    caf::replies_to<layer_o>::with<s_output>>;     // finish a layer, start the next or give logits

// Pipeline-parallel S-worker: a GPU stream over consecutive layers (numbered from 0).
using stage_actor = caf::typed_actor<
    caf::replies_to<step_tokens>::with<s_output>,  // first stage: embed, then its layer 0
    caf::replies_to<pp_enter>::with<s_output>,     // later stages: take x, then its layer 0
    caf::replies_to<layer_o>::with<s_output>>;     // finish a layer; next, logits or x onwards

// Tensor-parallel S-worker: one rank's slice of every layer.
using tp_rank_actor = caf::typed_actor<
    caf::replies_to<step_tokens>::with<s_output>,  // embed, then layer 0's Q/K/V slice
    caf::replies_to<tp_proj>::with<tp_partial>,    // attention projection addend
    caf::replies_to<tp_mlp>::with<tp_partial>,     // residual, then the MLP addend
    caf::replies_to<tp_next>::with<s_output>>;     // residual, then next Q/K/V slice or logits

// Data lane, gpu side: carries attention requests to the shards of one cpu node over a socket
// of its own, so tensor bytes are not copied through BASP (actors/data_lane.h).
using lane_actor = caf::typed_actor<
    caf::replies_to<lane_atom, int32_t, attn_request>::with<attn_reply>,  // to the node's shard i
    caf::reacts_to<lane_closed>,                            // its reader thread: connection over
    caf::reacts_to<expire_atom>,                            // no shards registered in time?
    caf::reacts_to<sweep_atom>,                             // fail the requests past their deadline
    caf::reacts_to<watch_atom, std::vector<shard_actor>>>;  // close once these shards are gone

// Data lane, cpu side: owns the connection whose reader thread hands requests to the local shards.
using lane_server_actor = caf::typed_actor<
    caf::reacts_to<lane_closed>>;  // its reader thread: the gpu node is gone

// A shard as the scheduler knows it.
struct shard_info {
  shard_actor hdl;
  std::string name;
  std::string node;          // the cpu node's --name; empty: in the gpu node's own process
  uint64_t pages = 0;        // KV-cache capacity
  int32_t page_tokens = 0;   // tokens per page
  int32_t group = 0;         // its R-group: which layers and heads it holds (model parallelism)
};

// CPU node -> gatekeeper: second step of joining; the shards are up and serve this run.
struct add_shards {
  std::string token;
  uint64_t run_id = 0;
  std::vector<shard_info> shards;
  uint64_t lane_key = 0;  // the node's data lane (lane_hello::key); 0: shards in this process
};

// CPU node -> gatekeeper: the node is shutting down; its sequences must move first.
struct leave_request {
  std::string token;
  std::vector<shard_actor> shards;
};

// Scheduler -> CPU node: the ids its shards got.
struct shard_ids {
  std::vector<int32_t> ids;
};

// Scheduler -> micro-batch: where a sequence's KV-cache lives, one shard per R-group.
struct seq_place {
  uint64_t seq = 0;
  std::vector<int32_t> shards;    // [groups] the scheduler's shard ids
  std::vector<shard_actor> hdls;  // [groups]
  bool on(int32_t shard) const {
    for (int32_t s : shards)
      if (s == shard) return true;
    return false;
  }
};

// Scheduler -> micro-batch (at spawn): a sequence of it.
struct seq_start {
  seq_place place;
  gen_request req;
};

// The rows one sequence adds to a step: tokens at positions [pos0, pos0 + tokens.size()).
struct seq_step {
  seq_place place;
  int32_t pos0 = 0;
  std::vector<int32_t> tokens;
};

// Micro-batch -> mini-batch: its sequences' rows for the next step.
struct mb_rows {
  std::vector<seq_step> seqs;
};

// Mini-batch -> micro-batch: next-token logits of its sequences, in the order of its mb_rows.
struct mb_logits {
  bytes logits;  // [seqs][vocab] f32
};

// Micro-batch: sequences that started together and step together until each has ended.
using micro_batch_actor = caf::typed_actor<
    caf::replies_to<rows_atom>::with<mb_rows>,   // rows of the next step (re-placing if needed)
    caf::replies_to<mb_logits>::with<mb_rows>,   // sample, then the rows of the next step
    caf::reacts_to<cancel_atom, uint64_t, std::string>,  // end a sequence with this error
    caf::reacts_to<lost_atom, int32_t>>;         // sequences on this shard must move

// Mini-batch: one stage of the two-stage pipeline, with its own GPU stream. It steps all its
// micro-batches together: one S-part batch, then per layer one message per shard.
using mini_batch_actor = caf::typed_actor<
    caf::reacts_to<add_atom, micro_batch_actor>,  // a micro-batch joins at the next step
    caf::reacts_to<lost_atom, int32_t>,           // a shard is gone: retry a step waiting on it
    caf::reacts_to<subscribe_atom, bool>,         // emit trace events (to the scheduler) or not
    caf::reacts_to<tick_atom>,                    // send the trace spans gathered so far
    caf::reacts_to<admitted_atom>,                // the scheduler admitted on a step's report
    caf::reacts_to<step_atom>>;                   // run the next step if idle

// Scheduler: admits requests, places sequences on shards, feeds micro-batches.
using scheduler_actor = caf::typed_actor<
    caf::replies_to<gen_request>::with<gen_result>,                  // generate a completion
    caf::reacts_to<seq_done>,                                        // a sequence left its batch
    caf::replies_to<add_shards>::with<shard_ids>,         // shards join (ids back)
    caf::replies_to<leave_request>::with<bool>,                      // shards leave after moving
    caf::replies_to<replace_request>::with<std::vector<seq_place>>,  // re-place sequences
    caf::reacts_to<lost_atom, int32_t>,                              // a shard stopped answering
    caf::replies_to<stats_atom>::with<sched_stats>,                  // shards, queue, live
    caf::reacts_to<trace_packed>,                                    // spans from a mini-batch
    caf::reacts_to<step_atom, int32_t>,                              // a mini-batch ended a step (-1: admit)
    caf::reacts_to<cancel_atom, uint64_t>,                           // the sender's request tag
    caf::reacts_to<subscribe_atom, trace_sink>,                      // stream trace events to it
    caf::reacts_to<tick_atom>>;                                      // expire waiting work

// Gatekeeper: the one actor a node publishes; checks the cluster secret and protocol version.
using gatekeeper_actor = caf::typed_actor<
    caf::replies_to<join_request>::with<join_reply>,              // CPU node: model shape
    caf::replies_to<add_shards>::with<shard_ids>,      // CPU node: register shards
    caf::replies_to<leave_request>::with<bool>,                   // CPU node: leave cleanly
    caf::replies_to<client_hello>::with<scheduler_actor>,         // client: the scheduler
    caf::replies_to<vocab_atom, client_hello>::with<vocab_msg>>;  // client: the tokenizer

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_info& x) {
  return f(caf::meta::type_name("shard_info"), x.hdl, x.name, x.node, x.pages, x.page_tokens,
           x.group);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, add_shards& x) {
  return f(caf::meta::type_name("add_shards"), x.token, x.run_id, x.shards, x.lane_key);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, leave_request& x) {
  return f(caf::meta::type_name("leave_request"), x.token, x.shards);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_ids& x) {
  return f(caf::meta::type_name("shard_ids"), x.ids);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, seq_place& x) {
  return f(caf::meta::type_name("seq_place"), x.seq, x.shards, x.hdls);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, seq_start& x) {
  return f(caf::meta::type_name("seq_start"), x.place, x.req);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, seq_step& x) {
  return f(caf::meta::type_name("seq_step"), x.place, x.pos0, x.tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, mb_rows& x) {
  return f(caf::meta::type_name("mb_rows"), x.seqs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, mb_logits& x) {
  return f(caf::meta::type_name("mb_logits"), x.logits);
}

}  // namespace fd

CAF_BEGIN_TYPE_ID_BLOCK(fastdecode, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(fastdecode, (fd::seq_rows))
CAF_ADD_TYPE_ID(fastdecode, (fd::attn_request))
CAF_ADD_TYPE_ID(fastdecode, (fd::attn_reply))
CAF_ADD_TYPE_ID(fastdecode, (fd::shard_stats))
CAF_ADD_TYPE_ID(fastdecode, (fd::sched_stats))
CAF_ADD_TYPE_ID(fastdecode, (fd::step_tokens))
CAF_ADD_TYPE_ID(fastdecode, (fd::layer_o))
CAF_ADD_TYPE_ID(fastdecode, (fd::s_output))
CAF_ADD_TYPE_ID(fastdecode, (fd::gen_request))
CAF_ADD_TYPE_ID(fastdecode, (fd::gen_result))
CAF_ADD_TYPE_ID(fastdecode, (fd::seq_done))
CAF_ADD_TYPE_ID(fastdecode, (fd::join_request))
CAF_ADD_TYPE_ID(fastdecode, (fd::join_reply))
CAF_ADD_TYPE_ID(fastdecode, (fd::client_hello))
CAF_ADD_TYPE_ID(fastdecode, (fd::replace_request))
CAF_ADD_TYPE_ID(fastdecode, (fd::shard_info))
CAF_ADD_TYPE_ID(fastdecode, (fd::add_shards))
CAF_ADD_TYPE_ID(fastdecode, (fd::leave_request))
CAF_ADD_TYPE_ID(fastdecode, (fd::seq_place))
CAF_ADD_TYPE_ID(fastdecode, (fd::seq_start))
CAF_ADD_TYPE_ID(fastdecode, (fd::seq_step))
CAF_ADD_TYPE_ID(fastdecode, (fd::mb_rows))
CAF_ADD_TYPE_ID(fastdecode, (fd::mb_logits))
CAF_ADD_TYPE_ID(fastdecode, (fd::token_event))
CAF_ADD_TYPE_ID(fastdecode, (fd::trace_event))
CAF_ADD_TYPE_ID(fastdecode, (fd::trace_batch))
CAF_ADD_TYPE_ID(fastdecode, (fd::trace_sink))
CAF_ADD_TYPE_ID(fastdecode, (fd::token_sink))
CAF_ADD_TYPE_ID(fastdecode, (fd::shard_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::stream_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::micro_batch_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::mini_batch_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::scheduler_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::gatekeeper_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::shard_ids))
CAF_ADD_TYPE_ID(fastdecode, (fd::vocab_msg))
CAF_ADD_TYPE_ID(fastdecode, (fd::pp_enter))
CAF_ADD_TYPE_ID(fastdecode, (fd::tp_proj))
CAF_ADD_TYPE_ID(fastdecode, (fd::tp_mlp))
CAF_ADD_TYPE_ID(fastdecode, (fd::tp_next))
CAF_ADD_TYPE_ID(fastdecode, (fd::tp_partial))
CAF_ADD_TYPE_ID(fastdecode, (fd::stage_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::tp_rank_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::trace_packed))
CAF_ADD_TYPE_ID(fastdecode, (fd::lane_hello))
CAF_ADD_TYPE_ID(fastdecode, (fd::lane_closed))
CAF_ADD_TYPE_ID(fastdecode, (fd::lane_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::lane_server_actor))
CAF_END_TYPE_ID_BLOCK(fastdecode)
