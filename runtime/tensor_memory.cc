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

uint8_t* map_huge(size_t bytes) {
  if (bytes > SIZE_MAX - kHugePage) return nullptr;
  // kHugePage more than asked, then the parts before the first boundary and after the end
  // unmapped: mmap aligns to 4 KiB only (Linux 6.1).
  const size_t mapped = bytes + kHugePage;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto lo = reinterpret_cast<uintptr_t>(p), start = (lo + kHugePage - 1) & ~(kHugePage - 1);
  if (start > lo) ::munmap(p, start - lo);
  if (start + bytes < lo + mapped) ::munmap(reinterpret_cast<void*>(start + bytes), lo + mapped - start - bytes);
  ::madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);  // a hint: EINVAL without THP
  return reinterpret_cast<uint8_t*>(start);
}

}  // namespace fd
