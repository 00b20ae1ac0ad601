// The REPL's side of one generation: sends the prompt to the scheduler, prints each token the
// moment it arrives, cancels on request, and notices a node that went away.
#pragma once
#include <cstdio>
#include <functional>
#include <string>

#include "actors/type_ids.h"
#include "caf/scoped_actor.hpp"
#include "examples/common/repl_commands.h"
#include "runtime/error.h"
#include "runtime/tokenizer.h"

namespace fd {

// The gpu node went away (connection lost or actor down).
class ConnectionLost : public Error {
 public:
  using Error::Error;
};

// The text with control characters other than newline and tab replaced by U+FFFD, so model
// output cannot move the cursor or send escape sequences to the terminal.
std::string terminal_safe(const std::string& text);

class ReplClient {
 public:
  // `where` names the node in messages. Monitors the scheduler (and `gate` when not null).
  ReplClient(caf::actor_system& sys, scheduler_actor scheduler, gatekeeper_actor gate,
             const Vocab& vocab, std::string where, caf::timespan silence_limit);

  // Generates a completion of `prompt`, writing the prompt and then each token's text
  // (terminal_safe) to `out` as it arrives. `should_cancel` is polled about every 50 ms; once it
  // says yes the request is cancelled on the node and the call returns when the node confirms.
  // Throws ConnectionLost.
  AnswerStats generate(const std::string& prompt, const ReplSettings& s, std::FILE* out,
                       const std::function<bool()>& should_cancel);

  // Throws ConnectionLost when the node went away since the last call (e.g. while idle).
  void check_connection();

  const Tokenizer& tokenizer() const { return tok_; }

 private:
  [[noreturn]] void lost();

  caf::scoped_actor self_;
  scheduler_actor scheduler_;
  gatekeeper_actor gate_;
  Tokenizer tok_;
  std::string where_;
  caf::timespan silence_limit_;  // no token or answer for this long: give up on the request
  uint64_t next_tag_ = 1;
};

}  // namespace fd
