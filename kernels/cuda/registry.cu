// The CUDA backend's kernel registry, filled once, and the launch helpers.
#include "cuda_util.cuh"
#include "sd/ops/registry.h"
#include <mutex>

namespace sd::cuda {
void registerElementwiseKernels();
void registerSoftmaxKernels();
void registerOptimizerKernels();
void registerLinalgKernels();
void registerMovementKernels();
void registerNormalizationKernels();
void registerReduceKernels();
void registerLossKernels();
void registerAttentionKernels();
void registerConvKernels();
void registerPoolKernels();
void registerCollectiveKernels();
void registerDropoutKernels();
void registerOsftKernels();
void registerRotaryKernels();
void registerCachedAttentionKernels();
void registerSwiGLUKernels();
void registerGemmEpilogueKernels();
void registerFusedElementwiseKernels();
void registerRecurrentKernels();
void registerResizeKernels();
void registerGeneratorKernels();
void registerIndexingKernels();
void registerQuantizedKernels();
void registerBitwiseKernels();
void registerClassicNormKernels();
void registerEinsumKernels();
void registerSelectionKernels();
void registerLinearAttentionKernels();
void registerGridSampleKernels();
void registerRoiAlignKernels();
void registerNonMaxSuppressionKernels();
void registerCol2ImKernels();
void registerIntegerProductKernels();
void registerHostComputedKernels();
void registerSpectralKernels();
void registerDeformConvKernels();

static KernelRegistry &mutableKernels() {
  static KernelRegistry r("cuda");
  return r;
}

// CUDA kernels compute f16/bf16 themselves (halfViaF32 = false).
void registerKernel(const char *op, KernelFn fn, TypeSet types, PrepareFn prepare, int typeOperand,
                    TypeSet resultTypes) {
  mutableKernels().add(KernelDef{op, fn, prepare, types, typeOperand, false, resultTypes});
}

Status cudaCheck(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return Status::ok();
  return sdError(what, ": ", cudaGetErrorString(e));
}

Status copyTensor(const TensorView &from, const TensorView &to, cudaStream_t stream, const char *op) {
  if (from.data == to.data || to.byteSize() == 0) return Status::ok();
  return cudaCheck(cudaMemcpyAsync(to.data, from.data, to.byteSize(), cudaMemcpyDeviceToDevice, stream), op);
}

std::shared_ptr<DeviceScratch> deviceScratch(size_t bytes) {
  auto s = std::make_shared<DeviceScratch>();
  if (cudaMalloc(&s->data, std::max<size_t>(bytes, 1)) != cudaSuccess) {
    cudaGetLastError(); // the step reports it when it runs
    return nullptr;
  }
  return s;
}

Status launchStatus(const char *op) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::ok();
  return sdError("CUDA kernel of '", op, "' failed to launch: ", cudaGetErrorString(e));
}

StatusOr<DeviceScalar> scalarOperand(const KernelContext &c, size_t i) {
  if (!c.hasInput(i) || !c.inputs[i].data) return sdError("operand ", i, " is missing");
  const TensorView &t = c.inputs[i];
  if (t.numElements() != 1) return sdError("operand ", i, " must be one number, it has ", t.numElements());
  switch (t.dtype) {
  case DType::F32: case DType::F64: case DType::I64: case DType::I32: case DType::F16: case DType::BF16:
  case DType::Bool:
    return DeviceScalar{t.data, t.dtype};
  default: return sdError("operand ", i, " has type ", dtypeName(t.dtype), ", not a number the CUDA backend reads");
  }
}

bool hostView(const PrepareContext &p, size_t i, TensorView &storage, const TensorView *&view) {
  view = nullptr;
  const KernelContext &c = p.kernel;
  if (!c.hasInput(i) || !c.inputs[i].data) return true;
  if (i >= p.hostInputs.size() || !p.hostInputs[i]) return false;
  storage = c.inputs[i];
  storage.data = const_cast<void *>(p.hostInputs[i]);
  view = &storage;
  return true;
}

// Operand i read through its host copy with `read` (an absent operand: empty).
template <typename V, typename Read>
bool hostValues(const PrepareContext &p, size_t i, std::vector<V> &out, Read read) {
  out.clear();
  TensorView storage;
  const TensorView *host;
  if (!hostView(p, i, storage, host)) return false;
  return !host || read(*host, out);
}

bool hostIntegers(const PrepareContext &p, size_t i, std::vector<int64_t> &out) {
  return hostValues(p, i, out, [](const TensorView &t, std::vector<int64_t> &v) { return readIntegers(t, v); });
}

bool hostDoubles(const PrepareContext &p, size_t i, std::vector<double> &out) {
  return hostValues(p, i, out, [](const TensorView &t, std::vector<double> &v) { return readDoubles(t, v); });
}

} // namespace sd::cuda

namespace sd {
const KernelRegistry &cudaKernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    registerAllOps(); // the schemas
    cuda::registerElementwiseKernels();
    cuda::registerSoftmaxKernels();
    cuda::registerOptimizerKernels();
    cuda::registerLinalgKernels();
    cuda::registerMovementKernels();
    cuda::registerNormalizationKernels();
    cuda::registerReduceKernels();
    cuda::registerLossKernels();
    cuda::registerAttentionKernels();
    cuda::registerConvKernels();
    cuda::registerPoolKernels();
    cuda::registerCollectiveKernels();
    cuda::registerDropoutKernels();
    cuda::registerOsftKernels();
    cuda::registerRotaryKernels();
    cuda::registerCachedAttentionKernels();
    cuda::registerSwiGLUKernels();
    cuda::registerGemmEpilogueKernels();
    cuda::registerFusedElementwiseKernels();
    cuda::registerRecurrentKernels();
    cuda::registerResizeKernels();
    cuda::registerGeneratorKernels();
    cuda::registerIndexingKernels();
    cuda::registerQuantizedKernels();
    cuda::registerBitwiseKernels();
    cuda::registerClassicNormKernels();
    cuda::registerEinsumKernels();
    cuda::registerSelectionKernels();
    cuda::registerLinearAttentionKernels();
    cuda::registerGridSampleKernels();
    cuda::registerRoiAlignKernels();
    cuda::registerNonMaxSuppressionKernels();
    cuda::registerCol2ImKernels();
    cuda::registerIntegerProductKernels();
    cuda::registerHostComputedKernels();
    cuda::registerSpectralKernels();
    cuda::registerDeformConvKernels();
  });
  return cuda::mutableKernels();
}
} // namespace sd
