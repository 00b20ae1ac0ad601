#include "examples/common/stop_signals.h"

#include <ctime>

namespace fd {

StopSignals::StopSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
}

int StopSignals::poll(std::chrono::milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000),
              static_cast<long>(timeout.count() % 1000) * 1000000L};
  const int sig = sigtimedwait(&set_, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

}  // namespace fd
