// Process-wide allocator settings for a serving process.
#pragma once

namespace fd {

// Tensor buffers of several MiB (Q/K/V, O, logits, data-lane frames) are allocated and freed
// every layer. glibc's malloc maps a buffer of 32 MiB or more, and any buffer too big for a
// thread's own arena, afresh each time, so each such layer paid a page fault and the kernel's
// zeroing per page: 64 MiB through the data lane reached 0.79-0.85 of TCP's throughput, and
// 1.08-1.16 with one heap that keeps freed memory. This makes every thread allocate from the
// main heap, which serves large buffers too and keeps up to 1 GiB freed for the next ones
// (small allocations still go through glibc's per-thread caches). Call at the start of main,
// before any thread starts. A no-op on other C libraries.
void reuse_tensor_memory();

}  // namespace fd
