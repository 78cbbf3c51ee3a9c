// Loads cuBLASLt once with dlopen (see cublaslt_api.h).
#include "cublaslt_api.h"
#include <dlfcn.h>
#include <mutex>

namespace sd::cuda {

const LtApi *cublasLt(std::string &error) {
  static LtApi api;
  static std::string loadError;
  static bool loaded = false;
  static std::once_flag once;
  std::call_once(once, [] {
    // The major version this build was compiled against, then the unversioned name.
    const std::string versioned = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void *lib = dlopen(versioned.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcublasLt.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char *why = dlerror();
      loadError = "cannot load " + versioned + " (" + (why ? why : "not found") +
                  "); install CUDA's cuBLAS or add its folder to LD_LIBRARY_PATH";
      return;
    }
    bool ok = true;
    auto sym = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && ok) {
        ok = false;
        loadError = versioned + " lacks " + name;
      }
    };
    sym(api.create, "cublasLtCreate");
    sym(api.destroy, "cublasLtDestroy");
    sym(api.descCreate, "cublasLtMatmulDescCreate");
    sym(api.descDestroy, "cublasLtMatmulDescDestroy");
    sym(api.descSetAttribute, "cublasLtMatmulDescSetAttribute");
    sym(api.layoutCreate, "cublasLtMatrixLayoutCreate");
    sym(api.layoutDestroy, "cublasLtMatrixLayoutDestroy");
    sym(api.layoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
    sym(api.preferenceCreate, "cublasLtMatmulPreferenceCreate");
    sym(api.preferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    sym(api.preferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    sym(api.algoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(api.matmul, "cublasLtMatmul");
    sym(api.statusString, "cublasLtGetStatusString");
    loaded = ok;
  });
  if (!loaded) {
    error = loadError;
    return nullptr;
  }
  return &api;
}

} // namespace sd::cuda
