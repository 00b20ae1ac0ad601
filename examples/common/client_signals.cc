#include "examples/common/client_signals.h"

#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <csignal>

namespace fd {
namespace {

// Async-signal-safe and stateless: on the main thread it does nothing, so an interrupted system
// call returns EINTR there.
void to_main_thread(int sig) {
  const pid_t pid = ::getpid();
  if (static_cast<pid_t>(::syscall(SYS_gettid)) != pid) ::syscall(SYS_tgkill, pid, pid, sig);
}

// Also async-signal-safe and stateless: on the main thread the signal joins the mask that the
// return from the handler restores, and is sent again, so it waits there.
void hold_for_main_thread(int sig, siginfo_t*, void* context) {
  const pid_t pid = ::getpid();
  if (static_cast<pid_t>(::syscall(SYS_gettid)) == pid) sigaddset(&static_cast<ucontext_t*>(context)->uc_sigmask, sig);
  ::syscall(SYS_tgkill, pid, pid, sig);
}

}  // namespace

void forward_signals_to_main_thread(std::initializer_list<int> signals) {
  struct sigaction sa {};
  sa.sa_handler = to_main_thread;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking read on the main thread returns EINTR
  for (int sig : signals) sigaction(sig, &sa, nullptr);
}

void hold_signals_for_main_thread(std::initializer_list<int> signals) {
  struct sigaction sa {};
  sa.sa_sigaction = hold_for_main_thread;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO;  // no SA_RESTART, as above
  for (int sig : signals) sigaction(sig, &sa, nullptr);
}

}  // namespace fd
