// Picks the S-part backend by name. The CUDA backend lives in a separate module
// (libfastdecode_cuda.so) loaded with dlopen only when asked for, so programs never link the
// CUDA libraries and run on machines without them.
#pragma once
#include <memory>
#include <string>

#include "runtime/model.h"
#include "runtime/spart.h"

namespace fd {

struct BackendOptions {
  int device = 0;       // CUDA device index
  int max_rows = 4096;  // CUDA: the most tokens one step may have; scratch grows on demand to it
};

// name: "cpu", "cuda" or "auto" (CUDA when the module loads and a GPU is usable, else CPU).
// "cuda" throws fd::Error saying why when it is impossible; "auto" then falls back to the CPU and
// sets *note (if note is not null) to one line saying why; otherwise *note says which backend
// was picked. The model must outlive the backend.
std::unique_ptr<SPartBackend> make_backend(const std::string& name, const Model& model,
                                           std::string* note);
std::unique_ptr<SPartBackend> make_backend(const std::string& name, const Model& model,
                                           std::string* note, const BackendOptions& options);

// CUDA GPUs usable through the module; 0 when the module cannot be loaded or no GPU is found,
// with the reason in *why (if not null).
int cuda_device_count(std::string* why = nullptr);

// The name of CUDA device `device` (e.g. "NVIDIA H100 80GB HBM3"), or "" when unknown.
std::string cuda_device_name(int device);

// Where the CUDA module is looked for: $FASTDECODE_CUDA_MODULE if set, else next to the
// running executable.
std::string cuda_module_path();

}  // namespace fd
