// How much memory this machine can give, and sizes as people read them.
#pragma once
#include <cstddef>
#include <string>

namespace fd {

// Memory this machine can give without swapping (/proc/meminfo MemAvailable), in bytes; 0 when
// unknown.
size_t available_memory();

// "40 KiB", "1.5 GiB".
std::string format_bytes(size_t bytes);

}  // namespace fd
