// The C interface of the CUDA backend module (libfastdecode_cuda.so), which the node loads with
// dlopen (runtime/backend_loader.cc) so that programs never link the CUDA libraries themselves.
// No CUDA headers here.
#pragma once
#include <cstddef>

namespace fd {
struct Model;
class SPartBackend;
}  // namespace fd

extern "C" {

// CUDA devices present; 0 when cudaGetDeviceCount fails (no driver, no GPU).
int fd_cuda_device_count();

// Writes the name of device into buf and returns 1, or writes why it cannot be queried and
// returns 0.
int fd_cuda_describe(int device, char* buf, size_t len);

// A CUDA backend over model on device whose activation scratch grows on demand up to max_rows
// rows per step; or null with the reason written into err. The model must outlive the backend;
// the caller owns the backend and deletes it through its virtual destructor.
fd::SPartBackend* fd_make_cuda_backend(const fd::Model* model, int device, int max_rows, char* err,
                                       size_t err_len);
}

namespace fd::cuda_abi {
using DeviceCountFn = decltype(&fd_cuda_device_count);
using DescribeFn = decltype(&fd_cuda_describe);
using MakeBackendFn = decltype(&fd_make_cuda_backend);
constexpr const char* kModuleFile = "libfastdecode_cuda.so";
}  // namespace fd::cuda_abi
