// Signal routing for fastdecode-repl, whose main thread lets SIGINT through while it waits in
// readline(). Threads that exist before main() (OpenBLAS starts its pool when the library loads)
// do not block the signal; the handler installed here resends a signal that lands on such a
// thread to the main thread, where it stays pending for StopSignals::poll() while blocked. On the
// main thread itself it does nothing, so the interrupted read returns EINTR. (StopSignals' own
// handler resends unconditionally, which suits only a main thread that never unblocks.)
#pragma once
#include <initializer_list>

namespace fd {

void forward_signals_to_main_thread(std::initializer_list<int> signals);

// The same for signals that must not be lost on the main thread: taken there, the handler still
// interrupts the read (EINTR), and leaves the signal pending and blocked as the handler returns,
// for StopSignals::poll() to take once the read is over.
void hold_signals_for_main_thread(std::initializer_list<int> signals);

}  // namespace fd
