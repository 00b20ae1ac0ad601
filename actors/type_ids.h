// The typed actor interfaces and the one CAF type-ID block of the project. A type missing here
// fails between nodes with a misleading `unexpected_message`.
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

// GPU stream: drives the S-part backend for one mini-batch in flight.
using stream_actor = caf::typed_actor<
    caf::replies_to<step_tokens>::with<s_output>,  // embed, then layer 0 up to attention
    caf::replies_to<layer_o>::with<s_output>>;     // finish a layer, start the next or give logits

// Micro-batch: a set of sequences that step through the model together.
using micro_batch_actor = caf::typed_actor<
    caf::reacts_to<seq_start>,             // admit a sequence at the next step
    caf::reacts_to<cancel_atom, uint64_t>, // drop a sequence (client gone)
    caf::reacts_to<step_atom>>;            // run the next step if idle

// Scheduler: admits requests, places sequences on shards, feeds micro-batches.
using scheduler_actor = caf::typed_actor<
    caf::replies_to<gen_request>::with<gen_result>,  // generate a completion
    caf::reacts_to<seq_done>>;                       // a sequence left its micro-batch

}  // namespace fd

CAF_BEGIN_TYPE_ID_BLOCK(fastdecode, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(fastdecode, (fd::seq_rows))
CAF_ADD_TYPE_ID(fastdecode, (fd::attn_request))
CAF_ADD_TYPE_ID(fastdecode, (fd::attn_reply))
CAF_ADD_TYPE_ID(fastdecode, (fd::shard_stats))
CAF_ADD_TYPE_ID(fastdecode, (fd::step_tokens))
CAF_ADD_TYPE_ID(fastdecode, (fd::layer_o))
CAF_ADD_TYPE_ID(fastdecode, (fd::s_output))
CAF_ADD_TYPE_ID(fastdecode, (fd::gen_request))
CAF_ADD_TYPE_ID(fastdecode, (fd::gen_result))
CAF_ADD_TYPE_ID(fastdecode, (fd::seq_start))
CAF_ADD_TYPE_ID(fastdecode, (fd::seq_done))
CAF_ADD_TYPE_ID(fastdecode, (fd::shard_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::stream_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::micro_batch_actor))
CAF_ADD_TYPE_ID(fastdecode, (fd::scheduler_actor))
CAF_END_TYPE_ID_BLOCK(fastdecode)
