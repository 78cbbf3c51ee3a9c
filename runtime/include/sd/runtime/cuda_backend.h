// The CUDA backend is a plugin, libsdcuda.so: the CUDA device, its kernel
// registry and the cuBLASLt comparison, with the CUDA runtime and every
// kernel's machine code inside. sdrun, libsd.so and the Python modules load
// it the first time something asks for CUDA, so a CPU run maps none of it,
// and the CUDA kernels' size does not weigh on every CPU process.
#pragma once
#include "sd/ops/cuda_gemm_compare.h"
#include "sd/ops/kernel.h"
#include "sd/runtime/device.h"
#include <cstdint>

namespace sd {

// Both sides are compiled from the same headers by the same build; this
// catches a plugin from another build, whose structs may differ.
struct CudaBackendAbi {
  uint32_t version;
  uint32_t sizes[7];
};
inline CudaBackendAbi cudaBackendAbi() {
  return {1u,
          {uint32_t(sizeof(KernelDef)), uint32_t(sizeof(KernelContext)), uint32_t(sizeof(PrepareContext)),
           uint32_t(sizeof(TensorView)), uint32_t(sizeof(Status)), uint32_t(sizeof(AttrMap)),
           uint32_t(sizeof(cuda::GemmTiming))}};
}

struct CudaBackend {
  const KernelRegistry &(*kernels)();
  // GPU 0, or the GPU of this process's local rank; an error naming why there is none.
  StatusOr<std::shared_ptr<Device>> (*openDevice)();
  StatusOr<std::vector<cuda::GemmTiming>> (*compareGemms)(const std::vector<cuda::GemmStep> &steps, int iterations,
                                                          int algorithms, std::string &device);
};

// The plugin, loaded once (SD_CUDA_PLUGIN names its file; else beside the
// binary, its ../lib, or the build's). The error says what is missing: CUDA
// in this build, the file, or a plugin of the same build.
StatusOr<const CudaBackend *> cudaBackend();

} // namespace sd

// The plugin's one exported symbol: its backend, or null with the reason in
// `error` when `caller` is not its own ABI.
extern "C" const sd::CudaBackend *sd_cuda_backend(const sd::CudaBackendAbi *caller, char *error, size_t errorBytes);
