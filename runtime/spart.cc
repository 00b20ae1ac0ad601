#include "runtime/spart.h"

#include <string>

namespace fd {

void check_step(const ModelConfig& cfg, const StepInput& in) {
  const int rows = static_cast<int>(in.tokens.size());
  if (in.pos.size() != in.tokens.size())
    throw Error("A step needs one position per token, got " + std::to_string(in.pos.size()) +
                " positions for " + std::to_string(rows) + " tokens.");
  for (int r = 0; r < rows; ++r) {
    if (in.tokens[r] < 0 || in.tokens[r] >= cfg.vocab)
      throw Error("Token id " + std::to_string(in.tokens[r]) + " is outside the vocabulary of " +
                  std::to_string(cfg.vocab) + " tokens.");
    if (in.pos[r] < 0 || (cfg.ctx > 0 && in.pos[r] >= cfg.ctx))
      throw Error("Token position " + std::to_string(in.pos[r]) +
                  " is outside the model's context of " + std::to_string(cfg.ctx) + " tokens.");
  }
  for (int32_t r : in.logit_rows)
    if (r < 0 || r >= rows)
      throw Error("Logit row " + std::to_string(r) + " is not a row of this step of " +
                  std::to_string(rows) + " tokens.");
}

}  // namespace fd
