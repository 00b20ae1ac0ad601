// `fastdecode-node --role all`: one process with the scheduler, a GPU stream and the shards.
#pragma once
#include <memory>

#include "examples/common/node_options.h"
#include "runtime/error.h"
#include "runtime/model.h"

namespace fd {

// The model of --model, or the built-in synthetic one (announced on stderr).
std::shared_ptr<const Model> load_or_synthesize(const std::string& path);

// Generates every prompt and prints the completions; returns the process exit code
// (0, or 1 when some prompt failed; the others still complete).
int run_prompts_all(const NodeArgs& args);

}  // namespace fd
