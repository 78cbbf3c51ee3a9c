// Loads the CUDA backend plugin (sd/runtime/cuda_backend.h) the first time
// something asks for CUDA, and opens the CUDA device through it.
#include "sd/runtime/cuda_backend.h"
#include "sd/format/plugin_path.h"
#include <dlfcn.h>
#include <unistd.h>

namespace sd {
namespace {

#ifdef SD_CUDA_BACKEND_BUILD_PATH
constexpr const char *kBuildPath = SD_CUDA_BACKEND_BUILD_PATH;
#else
constexpr const char *kBuildPath = nullptr;
#endif

using EntryFn = const CudaBackend *(*)(const CudaBackendAbi *, char *, size_t);

StatusOr<const CudaBackend *> load() {
  std::string tried;
  bool found = false;
  for (const std::string &path : pluginCandidates("libsdcuda.so", "SD_CUDA_PLUGIN", kBuildPath)) {
    // RTLD_LOCAL: the plugin's copies of our libraries and its CUDA runtime
    // stay its own. It is never unloaded: devices and kernels it made live on.
    found = found || access(path.c_str(), F_OK) == 0;
    void *lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char *why = dlerror();
      tried += (tried.empty() ? "" : "; ") + (why ? std::string(why) : path + ": not loadable");
      continue;
    }
    auto entry = reinterpret_cast<EntryFn>(dlsym(lib, "sd_cuda_backend"));
    if (!entry) return sdError(path, " is not sdc's CUDA backend (no sd_cuda_backend)");
    const CudaBackendAbi abi = cudaBackendAbi();
    char error[256] = "";
    const CudaBackend *backend = entry(&abi, error, sizeof error);
    if (!backend) return sdError(path, ": ", error);
    return backend;
  }
  if (!kBuildPath && !found)
    return sdError("this build has no CUDA backend (rebuild with the CUDA toolkit installed)");
  return sdError("the CUDA backend (libsdcuda.so) could not be loaded: ", tried);
}

} // namespace

StatusOr<const CudaBackend *> cudaBackend() {
  static const StatusOr<const CudaBackend *> backend = load(); // once, thread-safe (a function-local static)
  return backend;
}

StatusOr<std::shared_ptr<Device>> cudaDevice() {
  StatusOr<const CudaBackend *> backend = cudaBackend();
  if (!backend.isOk()) return backend.status();
  return backend.value()->openDevice();
}

} // namespace sd
