// CUDA kernels for MaxPool (with its optional Indices), AveragePool, LpPool,
// GlobalAveragePool, GlobalMaxPool and GlobalLpPool: one thread per output window, or one block per plane for
// the global pools (a fixed-order block reduction, sums in f64); and their
// gradients, one thread per input element.
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "sd/ops/flat_window.h"
#include <cmath>

namespace sd::cuda {
namespace {

// Max over the window's taps inside the input, with the CPU kernels' NaN
// rules: without Indices NaN taps never win (a window of only padding gives
// -inf); with Indices the first tap starts the comparison.
template <typename T>
__global__ void maxPoolKernel(FlatWindow w, int64_t planes, bool colMajor, const T *x, T *y, int64_t *indices) {
  using C = Compute<T>;
  int64_t total = planes * w.outTotal;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t oo = i % w.outTotal, plane = i / w.outTotal;
    const T *src = x + plane * w.inTotal;
    C best = -INFINITY;
    int64_t at = -1;
    for (int64_t kk = 0; kk < w.kernelTotal; ++kk) {
      int64_t off = w.tap(oo, kk);
      if (off < 0) continue;
      C v = load(src[off]);
      if (!indices) best = v > best ? v : best; // the CPU's 2-D path: NaN never wins
      else if (v > best || at < 0) {           // its general path (Indices): the first tap starts
        best = v;
        at = off;
      }
    }
    y[i] = store<T>(best);
    if (indices) {
      int64_t flat = at;
      if (colMajor && at >= 0) flat = (at % w.in[1]) * w.in[0] + at / w.in[1];
      indices[i] = plane * w.inTotal + flat;
    }
  }
}

// A pool's window over x [N, C, spatial...] (ceil_mode allowed).
StatusOr<FlatWindow> poolWindow(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, Dims(x.dims.begin() + 2, x.dims.end()), c.attrs.getInts("kernel_shape"),
                                    true, g));
  return flatWindowOf(g);
}

Status MaxPoolKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  StatusOr<FlatWindow> w = poolWindow(c);
  if (!w.isOk()) return w.status();
  int64_t planes = x.dims[0] * x.dims[1], total = y.numElements();
  if (total == 0) return Status::ok();
  int64_t *indices = c.outputs.size() > 1 && c.outputs[1].data ? c.outputs[1].as<int64_t>() : nullptr;
  bool colMajor = c.attrs.getInt("storage_order", 0) == 1 && w->rank == 2;
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    maxPoolKernel<T><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(*w, planes, colMajor, x.as<T>(), y.as<T>(),
                                                                     indices);
    return launchStatus("MaxPool");
  });
}

// Average over the window's taps inside the input (f64 sums, taps in order),
// divided by their count, or with count_include_pad by the taps inside the
// padded input.
template <typename T>
__global__ void avgPoolKernel(FlatWindow w, int64_t planes, bool includePad, const T *x, T *y) {
  int64_t total = planes * w.outTotal;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t oo = i % w.outTotal, plane = i / w.outTotal;
    const T *src = x + plane * w.inTotal;
    double acc = 0;
    int64_t count = 0;
    for (int64_t kk = 0; kk < w.kernelTotal; ++kk) {
      int64_t off = w.tap(oo, kk);
      if (off < 0) continue;
      acc += double(load(src[off]));
      ++count;
    }
    if (includePad) count = w.padCount(oo);
    y[i] = store<T>(Compute<T>(acc / double(count > 1 ? count : 1)));
  }
}

Status AveragePoolKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  StatusOr<FlatWindow> w = poolWindow(c);
  if (!w.isOk()) return w.status();
  int64_t planes = x.dims[0] * x.dims[1], total = y.numElements();
  if (total == 0) return Status::ok();
  bool includePad = c.attrs.getInt("count_include_pad", 0) != 0;
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    avgPoolKernel<T><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(*w, planes, includePad, x.as<T>(), y.as<T>());
    return launchStatus("AveragePool");
  });
}

// The p-norm over the window's taps inside the input: (sum |x|^p)^(1/p), in f64, taps in order.
template <typename T> __global__ void lpPoolKernel(FlatWindow w, int64_t planes, double p, const T *x, T *y) {
  int64_t total = planes * w.outTotal;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t oo = i % w.outTotal, plane = i / w.outTotal;
    const T *src = x + plane * w.inTotal;
    double acc = 0;
    for (int64_t kk = 0; kk < w.kernelTotal; ++kk) {
      int64_t off = w.tap(oo, kk);
      if (off >= 0) acc += pow(fabs(double(load(src[off]))), p);
    }
    y[i] = store<T>(Compute<T>(pow(acc, 1.0 / p)));
  }
}

Status LpPoolKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  StatusOr<FlatWindow> w = poolWindow(c);
  if (!w.isOk()) return w.status();
  int64_t planes = x.dims[0] * x.dims[1], total = y.numElements();
  if (total == 0) return Status::ok();
  const double p = double(c.attrs.getInt("p", 2));
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    lpPoolKernel<T><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(*w, planes, p, x.as<T>(), y.as<T>());
    return launchStatus("LpPool");
  });
}

enum class Global { Average, Max, Lp };

template <Global M, typename T>
__global__ void globalPoolKernel(int64_t planes, int64_t inner, double p, const T *x, T *y) {
  for (int64_t plane = blockIdx.x; plane < planes; plane += gridDim.x) {
    const T *src = x + plane * inner;
    double acc = M == Global::Max ? -INFINITY : 0.0;
    for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) {
      double v = double(load(src[i]));
      acc = M == Global::Max ? MaxOp()(acc, v) : acc + (M == Global::Lp ? pow(fabs(v), p) : v);
    }
    acc = M == Global::Max ? blockReduce(acc, MaxOp(), double(-INFINITY)) : blockReduce(acc, SumOp(), 0.0);
    if (M == Global::Average) acc /= double(inner > 0 ? inner : 1);
    if (M == Global::Lp) acc = pow(acc, 1.0 / p);
    if (threadIdx.x == 0) y[plane] = store<T>(Compute<T>(acc));
  }
}

template <Global M> Status globalPool(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t planes = x.dims[0] * x.dims[1], inner = x.numElements() / std::max<int64_t>(planes, 1);
  if (planes == 0) return Status::ok();
  const double p = double(c.attrs.getInt("p", 2));
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    globalPoolKernel<M, T><<<unsigned(std::min<int64_t>(planes, 1 << 20)), kThreads, 0, streamOf(c)>>>(
        planes, inner, p, x.as<T>(), c.outputs[0].as<T>());
    return launchStatus(M == Global::Max ? "GlobalMaxPool" : M == Global::Lp ? "GlobalLpPool" : "GlobalAveragePool");
  });
}

// MaxPoolGrad / AveragePoolGrad(dy, x) -> dx: one thread per input element
// gathers the windows that read it (sd/ops/flat_window.h's poolGradAt, the
// CPU-tested walk). No two threads write one element, so the sums are
// deterministic and, in f32/f64, the CPU's bits.
template <bool Max, typename T>
__global__ void poolGradKernel(FlatWindow w, int64_t planes, bool includePad, const T *dy, const T *x, T *dx) {
  using C = Compute<T>;
  const int64_t total = planes * w.inTotal;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = i / w.inTotal;
    const T *src = x + plane * w.inTotal, *gy = dy + plane * w.outTotal;
    dx[i] = store<T>(poolGradAt<Max, C>(
        w, i % w.inTotal, [src](int64_t off) { return load(src[off]); }, [gy](int64_t oo) { return load(gy[oo]); },
        includePad));
  }
}

template <bool Max> Status poolGrad(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &x = c.inputs[1], &dx = c.outputs[0];
  Dims in(x.dims.begin() + 2, x.dims.end()), kernel = c.attrs.getInts("kernel_shape");
  if (kernel.empty()) kernel = in; // the global pools
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, in, kernel, true, g));
  StatusOr<FlatWindow> w = flatWindowOf(g);
  if (!w.isOk()) return w.status();
  const int64_t planes = x.dims[0] * x.dims[1], total = dx.numElements();
  const char *name = Max ? "MaxPoolGrad" : "AveragePoolGrad";
  if (dy.numElements() != planes * w->outTotal || total != planes * w->inTotal)
    return sdError(name, ": gradient ", formatDims(dy.dims), " does not match the pool of ", formatDims(x.dims));
  if (total == 0) return Status::ok();
  const bool includePad = c.attrs.getInt("count_include_pad", 0) != 0;
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    poolGradKernel<Max, T><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(*w, planes, includePad, dy.as<T>(),
                                                                           x.as<T>(), dx.as<T>());
    return launchStatus(name);
  });
}

} // namespace

void registerPoolKernels() {
  registerKernel("MaxPool", MaxPoolKernel, floatStorage());
  registerKernel("AveragePool", AveragePoolKernel, floatStorage());
  registerKernel("LpPool", LpPoolKernel, TypeSet::floats()); // f32 and f64, as on the CPU
  registerKernel("GlobalAveragePool", globalPool<Global::Average>, floatStorage());
  registerKernel("GlobalMaxPool", globalPool<Global::Max>, floatStorage());
  registerKernel("GlobalLpPool", globalPool<Global::Lp>, TypeSet::floats());
  registerKernel("MaxPoolGrad", poolGrad<true>, floatStorage());
  registerKernel("AveragePoolGrad", poolGrad<false>, floatStorage());
}

} // namespace sd::cuda
