// `fastdecode-node --role all`: one process with the scheduler, a GPU stream and the shards.
#pragma once
#include <memory>

#include "actors/type_ids.h"
#include "examples/common/node_options.h"
#include "runtime/error.h"
#include "runtime/model.h"

namespace fd {

// The model of --model, or the built-in synthetic one (announced on stderr).
std::shared_ptr<const Model> load_or_synthesize(const std::string& path);

// Generates every prompt of args on the scheduler and prints the completions; returns the exit
// code (0, or 1 when some prompt failed; the others still complete).
int generate_and_print(caf::actor_system& sys, const scheduler_actor& scheduler,
                       const Model& model, const NodeArgs& args);

// `--role all`.
int run_prompts_all(const NodeArgs& args);

}  // namespace fd
