// CUDA kernels for MaxPool (with its optional Indices), AveragePool, LpPool,
// GlobalAveragePool, GlobalMaxPool, GlobalLpPool and MaxUnpool: one thread per output window, or one block per plane for
// the global pools (a fixed-order block reduction, sums in f64); and their
// gradients, one thread per input element.
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "sd/ops/dispatch.h"
#include "sd/ops/flat_window.h"
#include "sd/ops/index_geometry.h"
#include <memory>
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

// MaxUnpool: each X value goes where MaxPool found it, its index flat over
// the unpooled shape the attributes imply (which output_shape may pad at the
// end of each dim). Where indices repeat, the CPU's last write wins: each
// output element first claims its largest source with an integer atomicMax
// (the same winner in any order), then reads it. An index out of range,
// which the CPU refuses, is skipped.
struct Unpool {
  int rank;
  int64_t inferred[kMaxRank], outStrides[kMaxRank], inferredTotal;
};

template <typename I>
__global__ void claimUnpooledKernel(Unpool u, const I *indices, long long *owner, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t flat = int64_t(indices[e]), off = 0;
    if (flat < 0 || flat >= u.inferredTotal) continue;
    for (int d = u.rank - 1; d >= 0; --d) {
      off += (flat % u.inferred[d]) * u.outStrides[d];
      flat /= u.inferred[d];
    }
    atomicMax(owner + off, (long long)e);
  }
}

template <typename U> __global__ void readUnpooledKernel(const long long *owner, const U *x, U *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = owner[i] >= 0 ? x[owner[i]] : U(0);
}

std::shared_ptr<const void> prepareMaxUnpool(const PrepareContext &p) {
  return deviceScratch(size_t(p.kernel.outputs[0].numElements()) * sizeof(long long));
}

Status MaxUnpoolKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &o = c.outputs[0];
  const Dims kernel = c.attrs.getInts("kernel_shape"), strides = c.attrs.getInts("strides"),
             pads = c.attrs.getInts("pads");
  const size_t k = kernel.size();
  if (o.rank() > kMaxRank || x.rank() != int64_t(k) + 2 || o.rank() != x.rank() || ind.numElements() != x.numElements())
    return sdError("MaxUnpool on CUDA: X ", formatDims(x.dims), ", indices ", formatDims(ind.dims), " and output ",
                   formatDims(o.dims), " do not fit kernel_shape");
  Unpool u{int(o.rank()), {x.dims[0], x.dims[1]}, {}, 1};
  for (size_t d = 0; d < k; ++d)
    u.inferred[d + 2] = (x.dims[d + 2] - 1) * (strides.empty() ? 1 : strides[d]) -
                        (pads.empty() ? 0 : pads[d] + pads[d + k]) + kernel[d];
  const Dims outStrides = rowMajorStrides(o.dims);
  for (int d = 0; d < u.rank; ++d) {
    if (u.inferred[d] > o.dims[size_t(d)])
      return sdError("MaxUnpool output_shape ", formatDims(o.dims), " is smaller than the unpooled shape");
    u.outStrides[d] = outStrides[size_t(d)];
    u.inferredTotal *= u.inferred[d];
  }
  const DeviceScratch *scratch = scratchOf(c);
  if (!scratch) return sdError("MaxUnpool on CUDA: cannot allocate its scratch");
  long long *owner = scratch->as<long long>();
  const int64_t n = o.numElements(), m = x.numElements();
  if (n == 0) return Status::ok();
  cudaStream_t stream = streamOf(c);
  SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(owner, 0xff, size_t(n) * sizeof(long long), stream), "MaxUnpool"));
  if (m > 0) SD_RETURN_IF_ERROR(dispatchIndex(ind.dtype, [&](auto itag) {
    using I = decltype(itag);
    claimUnpooledKernel<I><<<blocksFor(m), kThreads, 0, stream>>>(u, ind.as<I>(), owner, m);
    return launchStatus("MaxUnpool");
  }));
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    readUnpooledKernel<U><<<blocksFor(n), kThreads, 0, stream>>>(owner, x.as<U>(), o.as<U>(), n);
    return launchStatus("MaxUnpool");
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
  registerKernel("MaxUnpool", MaxUnpoolKernel, TypeSet::all(), prepareMaxUnpool);
  registerKernel("AveragePoolGrad", poolGrad<false>, floatStorage());
}

} // namespace sd::cuda
