// CPU kernels of SwiGLU, y = silu(gate) * up, and its gradient: the gated
// MLP of Llama-class models in one pass over memory each way, instead of
// Sigmoid, two Muls and a backward of five more elementwise steps.
#include "cpu_util.h"
#include "half_convert.h"
#include "vecmath.h"
#include <algorithm>
#include <cmath>

namespace sd::cpu {
namespace {

constexpr int64_t kGrain = 16384; // elements per parallel chunk
constexpr int64_t kHalfChunk = 1024; // half elements widened at a time

// bf16/f16 operands computed as the f32 kernel computes them: each chunk
// widened exactly, the f32 math, the results rounded as the Cast kernel
// rounds. So a half SwiGLU equals Cast(SwiGLU(Cast(x))) bit for bit, which
// lets sd-half-elementwise drop those casts. `math(ins, outs, n)` on f32.
template <size_t In, size_t Out, typename F> Status halfChunks(const KernelContext &c, F &&math) {
  const DType t = c.inputs[0].dtype;
  parallelFor(c.pool, c.inputs[0].numElements(), kGrain, [&](int64_t b, int64_t e) {
    float wideIn[In][kHalfChunk], wideOut[Out][kHalfChunk];
    for (int64_t at = b; at < e; at += kHalfChunk) {
      const int64_t n = std::min(kHalfChunk, e - at);
      const float *ins[In];
      float *outs[Out];
      for (size_t i = 0; i < In; ++i) widenHalf(t, c.inputs[i].as<uint16_t>() + at, wideIn[i], n), ins[i] = wideIn[i];
      for (size_t o = 0; o < Out; ++o) outs[o] = wideOut[o];
      math(ins, outs, n);
      for (size_t o = 0; o < Out; ++o) narrowHalf(t, wideOut[o], c.outputs[o].as<uint16_t>() + at, n);
    }
  });
  return Status::ok();
}

Status checkSameShape(const KernelContext &c, size_t first, size_t count, const char *op) {
  for (size_t i = first + 1; i < first + count; ++i)
    if (c.inputs[i].dims != c.inputs[first].dims) return sdError(op, ": operands differ in shape");
  return Status::ok();
}

Status SwiGLUKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(checkSameShape(c, 0, 2, "SwiGLU"));
  const TensorView &gate = c.inputs[0], &up = c.inputs[1];
  const int64_t n = gate.numElements();
  if (dtypeIsHalf(gate.dtype))
    return halfChunks<2, 1>(c, [](const float **in, float **out, int64_t k) { vswiglu(in[0], in[1], out[0], k); });
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
  if (dtypeIsHalf(gate.dtype))
    return halfChunks<3, 2>(
        c, [](const float **in, float **out, int64_t k) { vswigluGrad(in[0], in[1], in[2], out[0], out[1], k); });
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

// Packed gate and up (SwiGLUPacked): row r of x holds its gate in x[r][0, F)
// and its up in x[r][F, 2F); the same math per row, so the same bits as the
// SwiGLU of a Split. Half operands reach these through f32 stand-ins (the
// runtime widens them, as for the casts they replace).
struct PackedRows {
  int64_t rows = 0, f = 0;
};
Status packedRows(const TensorView &x, const char *op, PackedRows &p) {
  if (x.rank() < 1 || x.dims.back() % 2) return sdError(op, ": x must be [..., 2F]");
  p.f = x.dims.back() / 2;
  p.rows = p.f ? x.numElements() / (2 * p.f) : 0;
  return Status::ok();
}

Status SwiGLUPackedKernel(const KernelContext &c) {
  PackedRows p;
  SD_RETURN_IF_ERROR(packedRows(c.inputs[0], "SwiGLUPacked", p));
  const int64_t f = p.f, grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(f, 1));
  if (c.inputs[0].dtype == DType::F32) {
    const float *x = c.inputs[0].as<float>();
    float *y = c.outputs[0].as<float>();
    parallelFor(c.pool, p.rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) vswiglu(x + r * 2 * f, x + r * 2 * f + f, y + r * f, f);
    });
    return Status::ok();
  }
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *x = c.inputs[0].as<T>();
    T *y = c.outputs[0].as<T>();
    parallelFor(c.pool, p.rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t j = 0; j < f; ++j) {
          const T g = x[r * 2 * f + j], u = x[r * 2 * f + f + j];
          y[r * f + j] = g * (T(1) / (T(1) + std::exp(-g))) * u;
        }
    });
    return Status::ok();
  });
}

Status SwiGLUPackedGradKernel(const KernelContext &c) {
  PackedRows p;
  SD_RETURN_IF_ERROR(packedRows(c.inputs[1], "SwiGLUPackedGrad", p));
  if (c.inputs[0].numElements() != p.rows * p.f) return sdError("SwiGLUPackedGrad: the gradient does not fit x");
  const int64_t f = p.f, grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(f, 1));
  if (c.inputs[1].dtype == DType::F32) {
    const float *d = c.inputs[0].as<float>(), *x = c.inputs[1].as<float>();
    float *dx = c.outputs[0].as<float>();
    parallelFor(c.pool, p.rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        vswigluGrad(d + r * f, x + r * 2 * f, x + r * 2 * f + f, dx + r * 2 * f, dx + r * 2 * f + f, f);
    });
    return Status::ok();
  }
  return dispatchFloat(c.inputs[1].dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *d = c.inputs[0].as<T>(), *x = c.inputs[1].as<T>();
    T *dx = c.outputs[0].as<T>();
    parallelFor(c.pool, p.rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t j = 0; j < f; ++j) {
          const T g = x[r * 2 * f + j], u = x[r * 2 * f + f + j], dy = d[r * f + j];
          const T s = T(1) / (T(1) + std::exp(-g));
          dx[r * 2 * f + f + j] = dy * g * s;
          dx[r * 2 * f + j] = dy * u * (s + g * s * (T(1) - s));
        }
    });
    return Status::ok();
  });
}

} // namespace

void registerSwiGLUKernels() {
  registerCpuKernel("SwiGLU", SwiGLUKernel, TypeSet::floats() | TypeSet::halves());
  registerCpuKernel("SwiGLUGrad", SwiGLUGradKernel, TypeSet::floats() | TypeSet::halves());
  registerCpuKernel("SwiGLUPacked", SwiGLUPackedKernel, TypeSet::floats());
  registerCpuKernel("SwiGLUPackedGrad", SwiGLUPackedGradKernel, TypeSet::floats(), nullptr, 1);
}

} // namespace sd::cpu
