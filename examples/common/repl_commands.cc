#include "examples/common/repl_commands.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace fd {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool parse_double(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return *end == '\0' && std::isfinite(out);
}

bool parse_int(const std::string& text, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtoll(text.c_str(), &end, 10);
  return *end == '\0';
}

bool parse_uint(const std::string& text, uint64_t& out) {
  if (text.empty() || text[0] == '-') return false;
  char* end = nullptr;
  out = std::strtoull(text.c_str(), &end, 10);
  return *end == '\0';
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

bool is_command(const std::string& line) {
  const std::string t = trim(line);
  return !t.empty() && t[0] == '/';
}

CommandOutcome run_command(const std::string& line, ReplSettings& s) {
  std::istringstream in(trim(line));
  std::string cmd, arg, extra;
  in >> cmd >> arg >> extra;
  CommandOutcome out;
  if (!extra.empty()) {
    out.message = cmd + " takes at most one value";
    return out;
  }
  const bool takes_value = cmd == "/temp" || cmd == "/topk" || cmd == "/topp" ||
                           cmd == "/seed" || cmd == "/max";
  if (takes_value && arg.empty()) {
    out.message = cmd + " needs a value (now: " + describe(s) + ")";
    return out;
  }
  if (!takes_value && !arg.empty() && cmd != "/help") {
    out.message = cmd + " takes no value";
    return out;
  }
  double d = 0;
  long long i = 0;
  uint64_t u = 0;
  if (cmd == "/quit" || cmd == "/exit") {
    out.action = ReplAction::quit;
  } else if (cmd == "/help") {
    out.action = ReplAction::help;
  } else if (cmd == "/stats") {
    out.action = ReplAction::stats;
  } else if (cmd == "/temp") {
    if (!parse_double(arg, d) || d < 0)
      out.message = "/temp needs a number >= 0 (0 = greedy), not '" + arg + "'";
    else {
      s.sampling.temperature = static_cast<float>(d);
      out.message = "temperature " + fmt("%g", d) + (d == 0 ? " (greedy)" : "");
    }
  } else if (cmd == "/topk") {
    if (!parse_int(arg, i) || i < 0 || i > (1 << 30))
      out.message = "/topk needs a whole number >= 0 (0 = no limit), not '" + arg + "'";
    else {
      s.sampling.top_k = static_cast<int>(i);
      out.message = "top-k " + std::to_string(i) + (i == 0 ? " (no limit)" : "");
    }
  } else if (cmd == "/topp") {
    if (!parse_double(arg, d) || !(d > 0 && d <= 1))
      out.message = "/topp needs a number in (0, 1] (1 = no limit), not '" + arg + "'";
    else {
      s.sampling.top_p = static_cast<float>(d);
      out.message = "top-p " + fmt("%g", d);
    }
  } else if (cmd == "/seed") {
    if (!parse_uint(arg, u))
      out.message = "/seed needs a whole number >= 0, not '" + arg + "'";
    else {
      s.sampling.seed = u;
      out.message = "seed " + std::to_string(u);
    }
  } else if (cmd == "/max") {
    if (!parse_int(arg, i) || i < 1 || i > (1 << 30))
      out.message = "/max needs a whole number of tokens >= 1, not '" + arg + "'";
    else {
      s.max_new = static_cast<int32_t>(i);
      out.message = "at most " + std::to_string(i) + " tokens per answer";
    }
  } else {
    out.message = "unknown command " + cmd + " (try /help)";
  }
  return out;
}

std::string repl_help() {
  return "Type a prompt and press Enter; the answer streams as it is generated.\n"
         "  /temp X   sampling temperature (0 = greedy)\n"
         "  /topk K   keep the K most likely tokens (0 = all)\n"
         "  /topp P   keep the smallest set of tokens with probability >= P (1 = all)\n"
         "  /seed S   sampling seed\n"
         "  /max N    generate at most N tokens\n"
         "  /stats    tokens/s and time to first token of the last answer\n"
         "  /help     this text\n"
         "  /quit     leave (or Ctrl-D)\n"
         "Ctrl-C stops a generation; at the prompt it clears the line.\n";
}

std::string describe(const ReplSettings& s) {
  return "temperature " + fmt("%g", s.sampling.temperature) + ", top-k " +
         std::to_string(s.sampling.top_k) + ", top-p " + fmt("%g", s.sampling.top_p) +
         ", seed " + std::to_string(s.sampling.seed) + ", at most " + std::to_string(s.max_new) +
         " tokens";
}

std::string format_stats(const AnswerStats* last) {
  if (!last) return "no answer yet";
  std::string out = std::to_string(last->tokens) + " tokens in " +
                    fmt("%.3f", last->client_ms / 1000) + " s" +
                    (last->cancelled ? " (cancelled)" : "");
  if (last->tokens == 0) return out;
  out += ": " + fmt("%.1f", last->tokens / (last->client_ms / 1000)) + " tokens/s";
  const double decode_ms = last->client_ms - last->client_ttft_ms;
  if (last->tokens > 1 && decode_ms > 0)
    out += " (" + fmt("%.1f", (last->tokens - 1) / (decode_ms / 1000)) +
           " tokens/s after the first)";
  out += "; time to first token " + fmt("%.1f", last->client_ttft_ms) + " ms";
  if (last->server_ms > 0)
    out += " (on the gpu node: " + fmt("%.1f", last->server_ttft_ms) + " ms to first token, " +
           fmt("%.1f", last->server_ms) + " ms in all)";
  return out;
}

}  // namespace fd
