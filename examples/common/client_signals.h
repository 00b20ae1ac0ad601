// Signal routing for the client programs. StopSignals blocks SIGINT/SIGTERM only in threads
// created after it; threads that exist before main() (OpenBLAS starts its pool when the library
// loads) still take these signals, and would lose them (or die of them). The handler installed
// here resends a signal that lands on such a thread to the main thread, where it stays pending
// for StopSignals::poll() while blocked, or interrupts a blocking read while unblocked.
#pragma once
#include <initializer_list>

namespace fd {

void forward_signals_to_main_thread(std::initializer_list<int> signals);

}  // namespace fd
