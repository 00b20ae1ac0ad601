#include "examples/common/stop_signals.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace fd {
namespace {

// Threads started before main (OpenBLAS starts its pool when the library loads) do not block the
// signals, so the kernel may deliver SIGTERM to one of them, whose default action would kill the
// process. This handler runs on such a thread and re-sends the signal to the main thread (tid ==
// pid), where it stays pending until poll() takes it.
void forward_to_main_thread(int sig) {
  syscall(SYS_tgkill, getpid(), getpid(), sig);
}

}  // namespace

StopSignals::StopSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  struct sigaction sa {};
  sa.sa_handler = forward_to_main_thread;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int StopSignals::poll(std::chrono::milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000),
              static_cast<long>(timeout.count() % 1000) * 1000000L};
  const int sig = sigtimedwait(&set_, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

}  // namespace fd
