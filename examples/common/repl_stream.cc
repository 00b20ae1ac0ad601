#include "examples/common/repl_stream.h"

#include "caf/all.hpp"

namespace fd {
namespace {

using clock = std::chrono::steady_clock;

double ms_since(clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
}

}  // namespace

std::string terminal_safe(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f)
      out += "\xEF\xBF\xBD";
    else
      out += c;
  }
  return out;
}

ReplClient::ReplClient(caf::actor_system& sys, scheduler_actor scheduler, gatekeeper_actor gate,
                       const Vocab& vocab, std::string where, caf::timespan silence_limit)
    : self_(sys),
      scheduler_(std::move(scheduler)),
      gate_(std::move(gate)),
      tok_(vocab),
      where_(std::move(where)),
      silence_limit_(silence_limit) {
  self_->monitor(scheduler_);
  if (gate_) self_->monitor(gate_);
}

void ReplClient::lost() { throw ConnectionLost("connection to " + where_ + " lost"); }

void ReplClient::check_connection() {
  bool gone = false, more = true;
  while (more && !gone)
    self_->receive([&](caf::down_msg&) { gone = true; },
                   [](token_event&) {},  // of an earlier answer
                   [](gen_result&) {},
                   caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
  if (gone) lost();
}

AnswerStats ReplClient::generate(const std::string& prompt, const ReplSettings& s,
                                 std::FILE* out, const std::function<bool()>& should_cancel) {
  check_connection();
  gen_request req;
  req.prompt = tok_.encode(prompt, tok_.vocab().add_bos);
  req.max_new = s.max_new;
  req.temperature = s.sampling.temperature;
  req.top_k = s.sampling.top_k;
  req.top_p = s.sampling.top_p;
  req.seed = s.sampling.seed;
  req.tag = next_tag_++;
  req.sink = caf::actor_cast<token_sink>(self_);
  const uint64_t tag = req.tag;
  int32_t prev = req.prompt.empty() ? -1 : req.prompt.back();
  std::vector<int32_t> shown;
  auto show = [&](int32_t id) {
    shown.push_back(id);
    if (id < 0 || id >= tok_.vocab().size()) return;  // not printable; the count still holds
    const std::string text = terminal_safe(tok_.piece(prev, id));
    prev = id;
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
  };

  std::fputs(terminal_safe(prompt).c_str(), out);
  std::fflush(out);
  AnswerStats st;
  const auto t0 = clock::now();
  auto last_heard = t0, cancelled_at = t0;
  bool done = false, gone = false, cancel_sent = false;
  gen_result result;
  self_->send(scheduler_, std::move(req));
  while (!done) {
    self_->receive(
        [&](token_event& ev) {
          if (ev.tag != tag) return;  // a late token of an earlier answer
          if (shown.empty()) st.client_ttft_ms = ms_since(t0);
          last_heard = clock::now();
          show(ev.token);
        },
        [&](gen_result& r) {
          result = std::move(r);
          done = true;
        },
        [&](caf::error& e) {
          result.error = self_->system().render(e);
          done = true;
        },
        [&](caf::down_msg&) { gone = true; },
        caf::after(std::chrono::milliseconds(50)) >> [] {});
    if (gone) lost();
    if (done) break;
    const auto now = clock::now();
    if (!cancel_sent && (should_cancel() || now - last_heard > silence_limit_)) {
      if (now - last_heard > silence_limit_)
        st.error = "no answer from " + where_ + " within " +
                   std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                      silence_limit_).count()) + " s";
      self_->send(scheduler_, cancel_atom::value, tag);
      cancel_sent = true;
      cancelled_at = now;
    } else if (cancel_sent && now - cancelled_at > silence_limit_) {
      throw Error("the gpu node at " + where_ + " did not confirm the cancellation");
    }
  }
  // Tokens the stream missed (none in order delivery, but the answer is the reference).
  const bool prefix = result.tokens.size() >= shown.size() &&
                      std::equal(shown.begin(), shown.end(), result.tokens.begin());
  if (result.error.empty() && prefix)
    for (size_t i = shown.size(); i < result.tokens.size(); ++i)
      if (result.tokens[i] != tok_.vocab().eos) show(result.tokens[i]);
  st.tokens = shown.size();
  st.client_ms = ms_since(t0);
  st.server_ttft_ms = result.ttft_ms;
  st.server_ms = result.ms;
  if (!result.error.empty() && cancel_sent && st.error.empty())
    st.cancelled = true;
  else if (!result.error.empty() && st.error.empty())
    st.error = result.error;
  std::fputc('\n', out);
  std::fflush(out);
  return st;
}

}  // namespace fd
