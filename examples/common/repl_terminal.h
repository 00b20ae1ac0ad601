// fastdecode-repl's terminal loop: libedit line editing and history, slash commands, streamed
// answers, Ctrl-C to stop a generation or clear the line, Ctrl-D to quit.
#pragma once
#include "examples/common/repl_options.h"

namespace fd {

// 0 after /quit or Ctrl-D, 1 when the node went away. Throws ClientRefused when the node refuses
// the secret or version, fd::Error when it cannot be reached.
int run_repl(const ReplArgs& args);

}  // namespace fd
