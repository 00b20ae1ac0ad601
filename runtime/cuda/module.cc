// The exported C functions of libfastdecode_cuda.so (runtime/cuda/module_abi.h). Everything
// else in the module has hidden visibility.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <memory>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/module_abi.h"

#define FD_EXPORT __attribute__((visibility("default")))

namespace {

void write(char* buf, size_t len, const char* text) {
  if (buf != nullptr && len > 0) std::snprintf(buf, len, "%s", text);
}

}  // namespace

extern "C" FD_EXPORT int fd_cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so later calls do not report it
    return 0;
  }
  return count;
}

extern "C" FD_EXPORT int fd_cuda_describe(int device, char* buf, size_t len) {
  char text[256];
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::snprintf(text, sizeof text, "cudaGetDeviceCount: %s", cudaGetErrorString(err));
    write(buf, len, text);
    return 0;
  }
  if (device < 0 || device >= count) {
    std::snprintf(text, sizeof text, "GPU %d does not exist; this machine has %d CUDA GPUs", device, count);
    write(buf, len, text);
    return 0;
  }
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::snprintf(text, sizeof text, "cudaGetDeviceProperties: %s", cudaGetErrorString(err));
    write(buf, len, text);
    return 0;
  }
  write(buf, len, prop.name);
  return 1;
}

extern "C" FD_EXPORT fd::SPartBackend* fd_make_cuda_backend(const fd::Model* model, int device,
                                                             int max_rows, char* err, size_t err_len) {
  try {
    return fd::cuda::make_cuda_backend(*model, device, max_rows).release();
  } catch (const std::exception& e) {
    write(err, err_len, e.what());
  } catch (...) {
    write(err, err_len, "The CUDA backend failed with an unknown exception.");
  }
  return nullptr;
}
