// Checks of CUDA runtime and cuBLAS results: a failure throws fd::Error naming the call and the
// device.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace fd::cuda {

void check(cudaError_t err, const char* call, int device);
void check(cublasStatus_t status, const char* call, int device);

}  // namespace fd::cuda

// call: a CUDA runtime or cuBLAS call; device: the device index it ran on.
#define FD_CUDA_CHECK(call, device) ::fd::cuda::check((call), #call, (device))
