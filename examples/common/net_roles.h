// `fastdecode-node --role gpu` (scheduler, S-part, gatekeeper on a port) and `--role cpu`
// (R-worker shards that join a gpu node).
#pragma once
#include "examples/common/node_options.h"

namespace fd {

int run_gpu_role(const NodeArgs& args);
int run_cpu_role(const NodeArgs& args);

}  // namespace fd
