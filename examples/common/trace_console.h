// fastdecode-trace: subscribes to a gpu node's trace events, shows a live view and records them.
#pragma once
#include "examples/common/trace_options.h"

namespace fd {

// 0 after --duration or Ctrl-C/SIGTERM, 1 when the node went away (the recording is still
// valid JSON). Throws ClientRefused or fd::Error when the node cannot be used.
int run_trace(const TraceArgs& args);

}  // namespace fd
