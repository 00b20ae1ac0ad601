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

}  // namespace fd
