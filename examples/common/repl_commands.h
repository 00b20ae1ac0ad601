// The REPL's slash commands and its per-answer statistics; no terminal or network here.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/sampler.h"

namespace fd {

// What the next prompt is generated with.
struct ReplSettings {
  int32_t max_new = 128;  // tokens to generate at most
  SamplingParams sampling;
};

// Timings of one answer.
struct AnswerStats {
  size_t tokens = 0;            // generated (streamed) tokens
  double client_ttft_ms = 0;    // from sending the prompt to the first token arriving here
  double client_ms = 0;         // from sending the prompt to the answer arriving here
  double server_ttft_ms = 0;    // the scheduler's: admission to first sampled token
  double server_ms = 0;         // the scheduler's: admission to last token
  bool cancelled = false;
  std::string error;            // why the node could not answer; empty on success or cancel
};

enum class ReplAction { none, quit, stats, help };

struct CommandOutcome {
  ReplAction action = ReplAction::none;
  std::string message;  // shown to the user (a confirmation or what is wrong)
};

// Whether the line is a command (its first non-blank character is '/').
bool is_command(const std::string& line);

// Applies a command to the settings. Unknown commands and bad values leave them unchanged and
// say why in the message.
CommandOutcome run_command(const std::string& line, ReplSettings& settings);

std::string repl_help();
std::string describe(const ReplSettings& s);
// "N tokens in T s: R tokens/s; time to first token F ms (...)", or a note that none was answered.
std::string format_stats(const AnswerStats* last);

}  // namespace fd
