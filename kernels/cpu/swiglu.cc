// CPU kernels of SwiGLU, y = silu(gate) * up, and its gradient: the gated
// MLP of Llama-class models in one pass over memory each way, instead of
// Sigmoid, two Muls and a backward of five more elementwise steps.
#include "cpu_util.h"
#include "vecmath.h"
#include <cmath>

namespace sd::cpu {
namespace {

constexpr int64_t kGrain = 16384; // elements per parallel chunk

Status checkSameShape(const KernelContext &c, size_t first, size_t count, const char *op) {
  for (size_t i = first + 1; i < first + count; ++i)
    if (c.inputs[i].dims != c.inputs[first].dims) return sdError(op, ": operands differ in shape");
  return Status::ok();
}

Status SwiGLUKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(checkSameShape(c, 0, 2, "SwiGLU"));
  const TensorView &gate = c.inputs[0], &up = c.inputs[1];
  const int64_t n = gate.numElements();
  if (gate.dtype == DType::F32) {
    const float *g = gate.as<float>(), *u = up.as<float>();
    float *y = c.outputs[0].as<float>();
    parallelFor(c.pool, n, kGrain, [&](int64_t b, int64_t e) { vswiglu(g + b, u + b, y + b, e - b); });
    return Status::ok();
  }
  return dispatchFloat(gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *g = gate.as<T>(), *u = up.as<T>();
    T *y = c.outputs[0].as<T>();
    parallelFor(c.pool, n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = g[i] * (T(1) / (T(1) + std::exp(-g[i]))) * u[i];
    });
    return Status::ok();
  });
}

Status SwiGLUGradKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(checkSameShape(c, 0, 3, "SwiGLUGrad"));
  const TensorView &dy = c.inputs[0], &gate = c.inputs[1], &up = c.inputs[2];
  const int64_t n = gate.numElements();
  if (gate.dtype == DType::F32) {
    const float *d = dy.as<float>(), *g = gate.as<float>(), *u = up.as<float>();
    float *dg = c.outputs[0].as<float>(), *du = c.outputs[1].as<float>();
    parallelFor(c.pool, n, kGrain, [&](int64_t b, int64_t e) { vswigluGrad(d + b, g + b, u + b, dg + b, du + b, e - b); });
    return Status::ok();
  }
  return dispatchFloat(gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *d = dy.as<T>(), *g = gate.as<T>(), *u = up.as<T>();
    T *dg = c.outputs[0].as<T>(), *du = c.outputs[1].as<T>();
    parallelFor(c.pool, n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T s = T(1) / (T(1) + std::exp(-g[i]));
        du[i] = d[i] * g[i] * s;
        dg[i] = d[i] * u[i] * (s + g[i] * s * (T(1) - s));
      }
    });
    return Status::ok();
  });
}

} // namespace

void registerSwiGLUKernels() {
  registerCpuKernel("SwiGLU", SwiGLUKernel, TypeSet::floats());
  registerCpuKernel("SwiGLUGrad", SwiGLUGradKernel, TypeSet::floats());
}

} // namespace sd::cpu
