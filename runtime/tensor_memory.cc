#include "runtime/tensor_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace fd {

void reuse_tensor_memory() {
#if defined(__GLIBC__)
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

void reserve_huge(std::vector<char>& b, size_t cap) {
  if (b.capacity() >= cap) return;
  std::vector<char> fresh;
  fresh.reserve(cap);  // allocated, not yet touched
  const auto p = reinterpret_cast<uintptr_t>(fresh.data());
  const uintptr_t lo = (p + kHugePage - 1) & ~(kHugePage - 1), hi = (p + cap) & ~(kHugePage - 1);
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
  fresh.assign(b.begin(), b.end());
  b.swap(fresh);
}

}  // namespace fd
