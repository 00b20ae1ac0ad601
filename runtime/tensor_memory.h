// Memory for tensor buffers: process-wide allocator settings, and large buffers backed by 2 MiB
// pages where the kernel has them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

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

constexpr size_t kHugePage = size_t(2) << 20;

// Capacity >= cap, contents kept. Fresh memory gets the huge-page hint (a hint only): a fresh
// multi-MiB buffer otherwise takes a page fault per 4 KiB as it is filled, which was about a
// quarter of the time of a 64 MiB payload through CAF.
void reserve_huge(std::vector<char>& b, size_t cap);

// `bytes` of anonymous memory, address space only until each page's first write (MAP_NORESERVE),
// starting on a kHugePage boundary and with the huge-page hint, so that the kernel backs it with
// 2 MiB pages wherever transparent huge pages are not "never". For data read in long runs from
// memory: with 4 KiB pages every 4 KiB read takes its own TLB entry, and a read that misses the
// TLB walks the page table first (the KV-cache, kv_store.cc; the bandwidth probe that measures
// against it). nullptr when the address space is not there. Release with munmap(p, bytes).
uint8_t* map_huge(size_t bytes);

}  // namespace fd
