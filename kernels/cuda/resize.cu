// CUDA kernel of Resize: every axis's taps (input index and weight per output
// position, sd/ops/resize_taps.h, the CPU kernel's own) resolved when the
// session is created, from the roi and scales constants, and uploaded; then
// one thread per output element sums its taps in f64 in the CPU kernel's
// order (leading axes' taps outer, the last axis's inner, zero weights
// skipped), so results match it to rounding. ResizeGrad applies the taps'
// adjoint (resizeAdjoint, the CPU kernel's own) one resized axis at a time,
// one thread per element of each pass summing its entries in output order in
// f64: deterministic, and equal to the CPU's to rounding.
#include "cuda_util.cuh"
#include "sd/ops/resize_taps.h"

namespace sd::cuda {
namespace {

struct ResizeGeometry {
  int rank = 0;
  int64_t out[kMaxRank] = {}, inStride[kMaxRank] = {};
  int taps[kMaxRank] = {};
  int64_t first[kMaxRank] = {}; // axis d's taps start at [first[d]] of index/weight; its outside flags at outFirst[d]
  int64_t outFirst[kMaxRank] = {};
  bool nearest = true;
  double extrapolation = 0;
};

struct ResizePrepared : PreparedError {
  ResizeGeometry g;
  int64_t *index = nullptr;
  double *weight = nullptr;
  uint8_t *outside = nullptr;
  ~ResizePrepared() {
    cudaFree(index);
    cudaFree(weight);
    cudaFree(outside);
  }
};

template <typename T>
__global__ void resizeKernel(ResizeGeometry g, int64_t n, const int64_t *index, const double *weight,
                             const uint8_t *outside, const T *x, T *y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t o[kMaxRank];
    bool out = false;
    int64_t rem = i;
    for (int d = g.rank - 1; d >= 0; --d) {
      o[d] = rem % g.out[d];
      rem /= g.out[d];
      out = out || outside[g.outFirst[d] + o[d]];
    }
    if (out) {
      y[i] = store<T>(Compute<T>(g.extrapolation));
      continue;
    }
    if (g.nearest) {
      int64_t off = 0;
      for (int d = 0; d < g.rank; ++d) off += index[g.first[d] + o[d]] * g.inStride[d];
      y[i] = x[off];
      continue;
    }
    // The leading axes' tap combinations (odometer, last leading axis fastest),
    // each times the last axis's taps.
    const int last = g.rank - 1;
    int k[kMaxRank] = {};
    double acc = 0;
    for (;;) {
      double wl = 1;
      int64_t off = 0;
      for (int d = 0; d < last; ++d) {
        const int64_t at = g.first[d] + o[d] * g.taps[d] + k[d];
        wl *= weight[at];
        off += index[at] * g.inStride[d];
      }
      for (int kk = 0; kk < g.taps[last]; ++kk) {
        const int64_t at = g.first[last] + o[last] * g.taps[last] + kk;
        const double w = wl * weight[at];
        if (w != 0) acc += w * double(load(x[off + index[at] * g.inStride[last]]));
      }
      int d = last - 1;
      for (; d >= 0; --d) {
        if (++k[d] < g.taps[d]) break;
        k[d] = 0;
      }
      if (d < 0) break;
    }
    y[i] = store<T>(Compute<T>(acc));
  }
}

// Every axis's taps from `in` to `out`, with the step's roi and scales, which
// must be known when the session is created: Resize's, and its gradient's
// the other way. False with `error` set when they cannot be had.
bool preparedTaps(const PrepareContext &p, const Dims &in, const Dims &out, const char *op,
                  std::vector<ResizeAxisTaps> &taps, std::string &error) {
  std::vector<double> roi, scales;
  if (!hostDoubles(p, 1, roi) || !hostDoubles(p, 2, scales)) {
    error = std::string(op) + " on CUDA needs its roi and scales known when the session is created (constants)";
    return false;
  }
  if (Status s = resizeTaps(p.kernel.attrs, in, out, roi, scales, taps); !s.isOk()) {
    error = s.message();
    return false;
  }
  return true;
}

std::shared_ptr<const void> prepareResize(const PrepareContext &p) {
  auto r = std::make_shared<ResizePrepared>();
  const KernelContext &c = p.kernel;
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  if (x.rank() > kMaxRank || x.rank() == 0) {
    r->error = "Resize on CUDA takes ranks 1 to 8";
    return r;
  }
  std::vector<ResizeAxisTaps> taps;
  if (!preparedTaps(p, x.dims, y.dims, "Resize", taps, r->error)) return r;
  ResizeGeometry &g = r->g;
  g.rank = int(x.rank());
  g.extrapolation = c.attrs.getFloat("extrapolation_value", 0.0);
  std::vector<int64_t> index;
  std::vector<double> weight;
  std::vector<uint8_t> outside;
  int64_t stride = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    g.inStride[d] = stride;
    stride *= x.dims[size_t(d)];
  }
  for (int d = 0; d < g.rank; ++d) {
    const ResizeAxisTaps &t = taps[size_t(d)];
    g.out[d] = y.dims[size_t(d)];
    g.taps[d] = t.taps;
    g.first[d] = int64_t(index.size());
    g.outFirst[d] = int64_t(outside.size());
    g.nearest = g.nearest && t.taps == 1;
    index.insert(index.end(), t.index.begin(), t.index.end());
    weight.insert(weight.end(), t.weight.begin(), t.weight.end());
    outside.insert(outside.end(), t.outside.begin(), t.outside.end());
  }
  if (!uploadVector(index, r->index) || !uploadVector(weight, r->weight) || !uploadVector(outside, r->outside)) {
    cudaGetLastError();
    r->error = "Resize: its taps could not be put on the device";
  }
  return r;
}

// x, roi?, scales?, sizes? -> y (the sizes are y's shape).
Status ResizeKernel(const KernelContext &c) {
  auto *r = static_cast<const ResizePrepared *>(c.prepared);
  if (!r) return sdError("Resize has no prepared taps");
  if (!r->error.empty()) return sdError(r->error);
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    resizeKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(r->g, n, r->index, r->weight, r->outside, x.as<T>(),
                                                                y.as<T>());
    return launchStatus("Resize");
  });
}

// One adjoint pass: the axis of size `out` in `src` becomes `in` in `dst`.
struct AdjointPass {
  int64_t outer = 1, in = 0, out = 0, inner = 1;
  int64_t *start = nullptr, *from = nullptr;
  double *weight = nullptr;
};

struct ResizeGradPrepared : PreparedError {
  std::vector<AdjointPass> passes; // last resized axis first
  double *buffers[2] = {nullptr, nullptr};
  ~ResizeGradPrepared() {
    for (AdjointPass &p : passes) cudaFree(p.start), cudaFree(p.from), cudaFree(p.weight);
    cudaFree(buffers[0]);
    cudaFree(buffers[1]);
  }
};

__global__ void adjointPassKernel(AdjointPass p, const double *src, double *dst) {
  const int64_t n = p.outer * p.in * p.inner;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % p.inner, i = (e / p.inner) % p.in, o = e / (p.inner * p.in);
    double acc = 0;
    for (int64_t k = p.start[i]; k < p.start[i + 1]; ++k) acc += p.weight[k] * src[(o * p.out + p.from[k]) * p.inner + j];
    dst[e] = acc;
  }
}

template <typename T> __global__ void widenKernel(int64_t n, const T *x, double *y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = double(load(x[i]));
}

template <typename T> __global__ void narrowKernel(int64_t n, const double *x, T *y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = store<T>(Compute<T>(x[i]));
}

std::shared_ptr<const void> prepareResizeGrad(const PrepareContext &p) {
  auto r = std::make_shared<ResizeGradPrepared>();
  const KernelContext &c = p.kernel;
  const TensorView &dy = c.inputs[0], &dx = c.outputs[0];
  std::vector<ResizeAxisTaps> taps;
  if (!preparedTaps(p, dx.dims, dy.dims, "ResizeGrad", taps, r->error)) return r;
  Dims shape = dy.dims;
  int64_t largest = std::max<int64_t>(dy.numElements(), 1);
  for (int64_t d = dx.rank() - 1; d >= 0; --d) {
    ResizeAxisAdjoint adj = resizeAdjoint(taps[size_t(d)], dx.dims[size_t(d)], shape[size_t(d)]);
    if (adj.identity) continue;
    AdjointPass pass;
    pass.in = dx.dims[size_t(d)];
    pass.out = shape[size_t(d)];
    for (size_t k = size_t(d) + 1; k < shape.size(); ++k) pass.inner *= shape[k];
    for (int64_t k = 0; k < d; ++k) pass.outer *= shape[size_t(k)];
    r->passes.push_back(pass);
    AdjointPass &kept = r->passes.back();
    if (!uploadVector(adj.start, kept.start) || !uploadVector(adj.from, kept.from) ||
        !uploadVector(adj.weight, kept.weight)) {
      cudaGetLastError();
      r->error = "ResizeGrad: its taps could not be put on the device";
      return r;
    }
    shape[size_t(d)] = pass.in;
    largest = std::max(largest, pass.outer * pass.in * pass.inner);
  }
  for (double *&b : r->buffers)
    if (cudaMalloc(&b, size_t(largest) * sizeof(double)) != cudaSuccess) {
      cudaGetLastError();
      r->error = "ResizeGrad: no device memory for its scratch";
      return r;
    }
  return r;
}

// dy, roi?, scales? -> dx of input_shape.
Status ResizeGradKernel(const KernelContext &c) {
  auto *r = static_cast<const ResizeGradPrepared *>(c.prepared);
  if (!r) return sdError("ResizeGrad has no prepared taps");
  if (!r->error.empty()) return sdError(r->error);
  const TensorView &dy = c.inputs[0], &dx = c.outputs[0];
  if (dy.numElements() == 0 || dx.numElements() == 0) {
    if (dx.numElements()) return cudaCheck(cudaMemsetAsync(dx.data, 0, dx.byteSize(), streamOf(c)), "ResizeGrad");
    return Status::ok();
  }
  return dispatchFloatStorage(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = dy.numElements();
    widenKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(n, dy.as<T>(), r->buffers[0]);
    int at = 0;
    for (const AdjointPass &pass : r->passes) {
      const int64_t m = pass.outer * pass.in * pass.inner;
      adjointPassKernel<<<blocksFor(m), kThreads, 0, streamOf(c)>>>(pass, r->buffers[at], r->buffers[1 - at]);
      at = 1 - at;
    }
    narrowKernel<T><<<blocksFor(dx.numElements()), kThreads, 0, streamOf(c)>>>(dx.numElements(), r->buffers[at],
                                                                              dx.as<T>());
    return launchStatus("ResizeGrad");
  });
}

} // namespace

void registerResizeKernels() {
  registerKernel("Resize", ResizeKernel, floatStorage(), prepareResize);
  registerKernel("ResizeGrad", ResizeGradKernel, floatStorage(), prepareResizeGrad);
}

} // namespace sd::cuda
