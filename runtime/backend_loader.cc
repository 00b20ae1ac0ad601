#include "runtime/backend_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "runtime/cuda/module_abi.h"
#include "runtime/error.h"

namespace fd {
namespace {

struct CudaModule {
  cuda_abi::DeviceCountFn device_count = nullptr;
  cuda_abi::DescribeFn describe = nullptr;
  cuda_abi::MakeBackendFn make_backend = nullptr;
};

std::string exe_dir() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return ".";
  const std::string path(buf.data(), static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Loads the module, or returns false with *why set. The handle is never closed: backends made
// by the module run its code until they are destroyed, which may be at process exit.
bool load_cuda_module(CudaModule* m, std::string* why) {
  const std::string path = cuda_module_path();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    *why = "the CUDA backend module could not be loaded (" + std::string(err ? err : path) +
           "); build with CUDA or set FASTDECODE_CUDA_MODULE";
    return false;
  }
  m->device_count = reinterpret_cast<cuda_abi::DeviceCountFn>(dlsym(handle, "fd_cuda_device_count"));
  m->describe = reinterpret_cast<cuda_abi::DescribeFn>(dlsym(handle, "fd_cuda_describe"));
  m->make_backend = reinterpret_cast<cuda_abi::MakeBackendFn>(dlsym(handle, "fd_make_cuda_backend"));
  if (m->device_count == nullptr || m->describe == nullptr || m->make_backend == nullptr) {
    *why = "the CUDA backend module " + path + " lacks the functions of this version of fastdecode";
    return false;
  }
  return true;
}

// The CUDA backend, or null with *why set.
std::unique_ptr<SPartBackend> try_cuda(const Model& model, const BackendOptions& o, std::string* why) {
  CudaModule m;
  if (!load_cuda_module(&m, why)) return nullptr;
  if (m.device_count() <= 0) {
    char text[256] = {};
    m.describe(0, text, sizeof text);
    *why = std::string("no usable CUDA GPU was found (") + text + ")";
    return nullptr;
  }
  char err[1024] = {};
  SPartBackend* b = m.make_backend(&model, o.device, o.max_rows, err, sizeof err);
  if (b == nullptr) {
    *why = err;
    while (!why->empty() && why->back() == '.') why->pop_back();
    return nullptr;
  }
  return std::unique_ptr<SPartBackend>(b);
}

}  // namespace

std::string cuda_module_path() {
  const char* env = std::getenv("FASTDECODE_CUDA_MODULE");
  if (env != nullptr && *env != '\0') return env;
  return exe_dir() + "/" + cuda_abi::kModuleFile;
}

int cuda_device_count(std::string* why) {
  std::string reason;
  CudaModule m;
  int n = 0;
  if (load_cuda_module(&m, &reason)) {
    n = m.device_count();
    if (n <= 0) {
      char text[256] = {};
      m.describe(0, text, sizeof text);
      reason = std::string("no usable CUDA GPU was found (") + text + ")";
    }
  }
  if (why != nullptr) *why = n > 0 ? "" : reason;
  return std::max(n, 0);
}

std::string cuda_device_name(int device) {
  CudaModule m;
  std::string why;
  if (!load_cuda_module(&m, &why)) return "";
  char text[256] = {};
  return m.describe(device, text, sizeof text) == 1 ? std::string(text) : "";
}

std::unique_ptr<SPartBackend> make_backend(const std::string& name, const Model& model,
                                           std::string* note) {
  return make_backend(name, model, note, BackendOptions{});
}

std::unique_ptr<SPartBackend> make_backend(const std::string& name, const Model& model,
                                           std::string* note, const BackendOptions& options) {
  std::string line;
  std::unique_ptr<SPartBackend> b;
  if (name == "cpu") {
    b = make_cpu_backend(model);
    line = "S-part backend: cpu.";
  } else if (name == "cuda" || name == "auto") {
    std::string why;
    b = try_cuda(model, options, &why);
    if (b != nullptr) {
      const std::string gpu = cuda_device_name(options.device);
      line = "S-part backend: cuda on GPU " + std::to_string(options.device) +
             (gpu.empty() ? "" : " (" + gpu + ")") + ".";
    } else if (name == "cuda") {
      throw Error("The CUDA backend was asked for but cannot run: " + why + ".");
    } else {
      b = make_cpu_backend(model);
      line = "S-part backend: cpu, because " + why + ".";
    }
  } else {
    throw Error("Unknown S-part backend '" + name + "'; use cpu, cuda or auto.");
  }
  if (note != nullptr) *note = line;
  return b;
}

}  // namespace fd
