#include "examples/common/repl_terminal.h"

#include <editline/readline.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "examples/common/client_connection.h"
#include "examples/common/client_signals.h"
#include "examples/common/repl_stream.h"
#include "examples/common/stop_signals.h"

namespace fd {
namespace {

constexpr auto kRequestTimeout = std::chrono::seconds(10);    // hello and vocabulary

enum class LineKind { text, interrupted, eof };

struct Line {
  LineKind kind = LineKind::eof;
  std::string text;
};

// Reads one line with libedit. Outside this call SIGINT and SIGTERM stay blocked (StopSignals);
// here they are let through, so both interrupt the read (EINTR): Ctrl-C is then done with (the
// handler of forward_signals_to_main_thread does nothing on the main thread), SIGTERM stays
// pending (hold_signals_for_main_thread) and ends the REPL as end of input does. A SIGTERM that
// lands in the few instructions between the check after unblocking and the read is held until the
// next line is typed.
Line read_line(const char* prompt, StopSignals& signals) {
  const auto terminated = [&] {  // takes the pending signals; a Ctrl-C of the last answer is stale
    bool term = false;
    while (int sig = signals.poll(std::chrono::milliseconds(0))) term = term || sig == SIGTERM;
    return term;
  };
  if (terminated()) return Line{LineKind::eof, ""};
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
  sigset_t pending;
  if (sigpending(&pending) == 0 && sigismember(&pending, SIGTERM) == 1) {  // held as it was unblocked
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    terminated();
    return Line{LineKind::eof, ""};
  }
  errno = 0;
  std::unique_ptr<char, decltype(&std::free)> raw(readline(prompt), &std::free);
  const int err = errno;
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  if (raw) return Line{LineKind::text, raw.get()};
  if (err != EINTR || terminated()) return Line{LineKind::eof, ""};
  return Line{LineKind::interrupted, ""};
}

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

}  // namespace

int run_repl(const ReplArgs& args) {
  StopSignals signals;  // before the actor system: its threads inherit the blocked mask
  // Ctrl-C interrupts readline() and, during a generation, waits for StopSignals::poll(). SIGTERM
  // ends the REPL as Ctrl-D does, at the prompt or during a generation (whose sequence is
  // cancelled), so that libedit restores the terminal first.
  forward_signals_to_main_thread({SIGINT});
  hold_signals_for_main_thread({SIGTERM});
  // libedit's own handlers would take these signals instead: they put back the handlers above, then
  // re-send the signal with kill(0, sig), to the whole process group, a parent shell or script
  // without job control included (a SIGTERM ended both), from whichever thread the signal landed
  // on. Without them the read simply returns EINTR, and libedit restores the terminal on return.
  rl_catch_signals = 0;
  caf::actor_system_config cfg;
  configure_client(cfg);
  caf::actor_system sys{cfg};
  const ClientConnection conn = connect_client(sys, args.connect, args.token, kRequestTimeout);
  const Vocab vocab = fetch_vocab(sys, conn, kRequestTimeout);
  const auto silence = std::chrono::duration_cast<caf::timespan>(
      std::chrono::duration<double>(args.silence_s));
  ReplClient client(sys, conn.scheduler, conn.gate, vocab, conn.where, silence);
  ReplSettings settings = args.settings;
  std::optional<AnswerStats> last;
  const bool interactive = isatty(STDIN_FILENO);
  if (interactive)
    std::printf("connected to %s (%d-token vocabulary); %s. /help lists the commands.\n",
                conn.where.c_str(), vocab.size(), describe(settings).c_str());
  try {
    while (true) {
      const Line line = read_line(interactive ? "> " : "", signals);
      if (line.kind == LineKind::eof) {
        if (interactive) std::printf("\n");
        break;
      }
      if (line.kind == LineKind::interrupted) {
        std::printf("\n");  // the half-typed line is dropped
        continue;
      }
      if (blank(line.text)) continue;
      add_history(line.text.c_str());
      if (is_command(line.text)) {
        const CommandOutcome c = run_command(line.text, settings);
        if (c.action == ReplAction::quit) break;
        if (c.action == ReplAction::help) std::fputs(repl_help().c_str(), stdout);
        if (c.action == ReplAction::stats)
          std::printf("%s\n", format_stats(last ? &*last : nullptr).c_str());
        if (!c.message.empty()) std::printf("%s\n", c.message.c_str());
        std::fflush(stdout);
        continue;
      }
      bool terminate = false;
      const AnswerStats st = client.generate(line.text, settings, stdout, [&] {
        const int sig = signals.poll(std::chrono::milliseconds(0));
        terminate = terminate || sig == SIGTERM;
        return sig != 0;
      });
      if (st.cancelled) std::printf("[cancelled after %zu tokens]\n", st.tokens);
      if (!st.error.empty()) std::printf("error: %s\n", st.error.c_str());
      std::fflush(stdout);
      last = st;
      if (terminate) break;
    }
  } catch (const ConnectionLost& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nfastdecode-repl: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace fd
