// CUDA kernels of SwiGLU, y = silu(gate) * up, and its gradient (see
// kernels/cpu/swiglu.cc): one thread per element, grid-stride.
#include "cuda_util.cuh"

namespace sd::cuda {
namespace {

template <typename T> __global__ void swigluKernel(const T *gate, const T *up, T *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const Compute<T> g = load(gate[i]), s = Compute<T>(1) / (Compute<T>(1) + exp(-g));
    y[i] = store<T>(g * s * load(up[i]));
  }
}

template <typename T>
__global__ void swigluGradKernel(const T *dy, const T *gate, const T *up, T *dgate, T *dup, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const Compute<T> g = load(gate[i]), d = load(dy[i]), s = Compute<T>(1) / (Compute<T>(1) + exp(-g));
    dup[i] = store<T>(d * g * s);
    dgate[i] = store<T>(d * load(up[i]) * (s + g * s * (Compute<T>(1) - s)));
  }
}

Status SwiGLUKernel(const KernelContext &c) {
  const TensorView &gate = c.inputs[0], &up = c.inputs[1];
  if (up.dims != gate.dims) return sdError("SwiGLU: gate and up differ in shape");
  const int64_t n = gate.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    swigluKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(gate.as<T>(), up.as<T>(), c.outputs[0].as<T>(), n);
    return launchStatus("SwiGLU");
  });
}

Status SwiGLUGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &gate = c.inputs[1], &up = c.inputs[2];
  if (up.dims != gate.dims || dy.dims != gate.dims) return sdError("SwiGLUGrad: operands differ in shape");
  const int64_t n = gate.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    swigluGradKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(dy.as<T>(), gate.as<T>(), up.as<T>(),
                                                                     c.outputs[0].as<T>(), c.outputs[1].as<T>(), n);
    return launchStatus("SwiGLUGrad");
  });
}

} // namespace

void registerSwiGLUKernels() {
  registerKernel("SwiGLU", SwiGLUKernel, floatStorage());
  registerKernel("SwiGLUGrad", SwiGLUGradKernel, floatStorage());
}

} // namespace sd::cuda
