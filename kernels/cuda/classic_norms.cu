// CUDA kernels for ONNX's older normalizations, in the CPU kernels' f64 math
// (sd/ops/math/classic_norms.h): LpNormalization (a thread per line along the
// axis), LRN (a thread per element) and MeanVarianceNormalization (a thread
// per group of reduced elements). Rare in plans; here so a step that keeps
// one does not split its entry for a CPU round trip.
#include "cuda_util.cuh"
#include "sd/ops/index_geometry.h"
#include "sd/ops/math/classic_norms.h"
#include <string>
#include <vector>

namespace sd::cuda {
namespace {

template <typename T> __global__ void lpNormKernel(const T *x, T *y, int64_t lines, int64_t n, int64_t inner, int64_t p) {
  for (int64_t l = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; l < lines; l += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = l / inner * n * inner + l % inner;
    math::lpNormalizeLine(
        n, p, [&](int64_t j) { return double(load(x[base + j * inner])); },
        [&](int64_t j, double v) { y[base + j * inner] = store<T>(Compute<T>(v)); });
  }
}

Status LpNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", -1);
  const int64_t p = c.attrs.getInt("p", 2);
  if (axis < 0) axis += x.rank();
  if (p != 1 && p != 2) return sdError("LpNormalization p must be 1 or 2, got ", p);
  if (axis < 0 || axis >= x.rank()) return sdError("LpNormalization axis out of range for rank ", x.rank());
  const AxisExtent ext = extentAround(x.dims, axis);
  const int64_t lines = ext.outer * ext.inner;
  if (lines == 0 || ext.len == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    lpNormKernel<T><<<blocksFor(lines), kThreads, 0, streamOf(c)>>>(x.as<T>(), c.outputs[0].as<T>(), lines, ext.len,
                                                                   ext.inner, p);
    return launchStatus("LpNormalization");
  });
}

struct LrnShape {
  int64_t channels = 0, spatial = 0, size = 0;
  double alpha = 0, beta = 0, bias = 0;
};

template <typename T> __global__ void lrnKernel(LrnShape s, const T *x, T *y, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % s.spatial, k = i / s.spatial % s.channels, item = i / (s.spatial * s.channels);
    const T *at = x + item * s.channels * s.spatial + j;
    y[i] = store<T>(Compute<T>(math::lrnAt(k, s.channels, s.size, s.alpha, s.beta, s.bias,
                                           [&](int64_t q) { return double(load(at[q * s.spatial])); })));
  }
}

Status LrnKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  if (x.rank() < 2) return sdError("LRN needs [N, C, ...], got rank ", x.rank());
  LrnShape s;
  s.alpha = c.attrs.getFloat("alpha", 1e-4);
  s.beta = c.attrs.getFloat("beta", 0.75);
  s.bias = c.attrs.getFloat("bias", 1.0);
  s.size = c.attrs.getInt("size", 0);
  if (s.size < 1) return sdError("LRN size must be positive, got ", s.size);
  s.channels = x.dims[1];
  const int64_t total = x.numElements();
  if (total == 0) return Status::ok();
  s.spatial = total / (x.dims[0] * s.channels);
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    lrnKernel<T><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(s, x.as<T>(), c.outputs[0].as<T>(), total);
    return launchStatus("LRN");
  });
}

// The kept dims (one group each) and the reduced dims (a group's members), with x's strides.
struct MvnGroups {
  Shape8 kept, reduced;
  int64_t keptStride[kMaxRank] = {}, reducedStride[kMaxRank] = {};
  int64_t groups = 1, members = 1;
};

__device__ inline int64_t offsetOf(const Shape8 &shape, const int64_t *strides, int64_t index) {
  int64_t off = 0;
  for (int d = shape.rank - 1; d >= 0; --d) {
    off += index % shape.dims[d] * strides[d];
    index /= shape.dims[d];
  }
  return off;
}

template <typename T> __global__ void mvnKernel(MvnGroups g, const T *x, T *y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < g.groups; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = offsetOf(g.kept, g.keptStride, i);
    auto at = [&](int64_t j) { return base + offsetOf(g.reduced, g.reducedStride, j); };
    math::meanVarianceNormalize(
        g.members, [&](int64_t j) { return double(load(x[at(j)])); },
        [&](int64_t j, double v) { y[at(j)] = store<T>(Compute<T>(v)); });
  }
}

Status MvnKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  std::vector<int64_t> axes = c.attrs.getInts("axes");
  if (axes.empty()) axes = {0, 2, 3};
  if (x.rank() > kMaxRank) return sdError("MeanVarianceNormalization on CUDA takes up to rank ", kMaxRank);
  std::vector<bool> reduced(size_t(x.rank()), false);
  for (int64_t a : axes) {
    const int64_t d = a < 0 ? a + x.rank() : a;
    if (d < 0 || d >= x.rank()) return sdError("MeanVarianceNormalization axis ", a, " out of range for rank ", x.rank());
    reduced[size_t(d)] = true;
  }
  const Dims strides = stridesOf(x.dims);
  MvnGroups g;
  for (int64_t d = 0; d < x.rank(); ++d) {
    const bool r = reduced[size_t(d)];
    Shape8 &s = r ? g.reduced : g.kept;
    (r ? g.reducedStride : g.keptStride)[s.rank] = strides[size_t(d)];
    s.dims[s.rank++] = x.dims[size_t(d)];
    (r ? g.members : g.groups) *= x.dims[size_t(d)];
  }
  if (x.numElements() == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    mvnKernel<T><<<blocksFor(g.groups), kThreads, 0, streamOf(c)>>>(g, x.as<T>(), c.outputs[0].as<T>());
    return launchStatus("MeanVarianceNormalization");
  });
}

} // namespace

void registerClassicNormKernels() {
  registerKernel("LpNormalization", LpNormKernel, floatStorage());
  registerKernel("LRN", LrnKernel, floatStorage());
  registerKernel("MeanVarianceNormalization", MvnKernel, floatStorage());
}

} // namespace sd::cuda
