// Owners of device memory and pinned (page-locked) host memory. reset() reallocates without
// keeping the contents; the caller makes sure no queued work still uses the old memory.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "runtime/cuda/check.h"

namespace fd::cuda {

// kPinned: cudaMallocHost memory the GPU copies to and from asynchronously; else device memory.
template <typename T, bool kPinned>
class Memory {
 public:
  Memory() = default;
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory() { release(); }

  // Makes room for exactly n elements on device (the current device).
  void reset(size_t n, int device) {
    release();
    if (n == 0) return;
    void* p = nullptr;
    const std::string call = std::string(kPinned ? "cudaMallocHost" : "cudaMalloc") + " of " +
                             std::to_string(n * sizeof(T)) + " bytes";
    check(kPinned ? cudaMallocHost(&p, n * sizeof(T)) : cudaMalloc(&p, n * sizeof(T)), call.c_str(),
          device);
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  // Errors are ignored: this runs in destructors, and a failed free leaks at worst.
  void release() {
    if (p_ != nullptr) {
      if (kPinned)
        (void)cudaFreeHost(p_);
      else
        (void)cudaFree(p_);
    }
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

template <typename T>
using DeviceArray = Memory<T, false>;
template <typename T>
using PinnedArray = Memory<T, true>;

}  // namespace fd::cuda
