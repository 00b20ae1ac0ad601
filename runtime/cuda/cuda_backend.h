// The CUDA S-part backend; built only into libfastdecode_cuda.so (see runtime/cuda/module_abi.h).
#pragma once
#include <memory>

#include "runtime/spart.h"

namespace fd::cuda {

// Uploads model's weights to GPU `device` once, in fp16 (norm weights stay fp32). Each state's
// activation scratch grows on demand with the rows of its steps, up to max_rows rows; a larger
// step throws. The model is read only here; the backend keeps no reference to it.
std::unique_ptr<SPartBackend> make_cuda_backend(const Model& model, int device, int max_rows);

}  // namespace fd::cuda
