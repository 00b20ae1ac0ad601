// SIGINT/SIGTERM as events: blocked in every thread created after construction (so construct it
// before the actor system), then polled.
#pragma once
#include <chrono>
#include <csignal>

namespace fd {

class StopSignals {
 public:
  StopSignals();
  // The signal that arrived within `timeout`, or 0.
  int poll(std::chrono::milliseconds timeout);

 private:
  sigset_t set_;
};

}  // namespace fd
