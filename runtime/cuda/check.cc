#include "runtime/cuda/check.h"

#include <string>

#include "runtime/error.h"

namespace fd::cuda {

void check(cudaError_t err, const char* call, int device) {
  if (err == cudaSuccess) return;
  throw Error(std::string("CUDA call ") + call + " failed on GPU " + std::to_string(device) + ": " +
              cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ").");
}

void check(cublasStatus_t status, const char* call, int device) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string("cuBLAS call ") + call + " failed on GPU " + std::to_string(device) + ": " +
              cublasGetStatusString(status) + ".");
}

}  // namespace fd::cuda
