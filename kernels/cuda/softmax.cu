// CUDA kernels for Softmax and LogSoftmax along one axis and their backward
// ops: one block per row (a row strides by `inner` through memory), block
// reductions in a fixed order, sums in f64 as the CPU kernels do; and
// Hardmax, a thread per row.
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "sd/ops/index_geometry.h"
#include <cmath>

namespace sd::cuda {
namespace {

struct Rows {
  int64_t outer = 1, n = 1, inner = 1;
  __device__ int64_t base(int64_t r) const { return (r / inner) * n * inner + r % inner; }
};

// The CPU kernels' split (index_geometry.h): coerce2d flattens from `axis` on.
Rows rowsOf(const KernelContext &c) {
  AxisSplit s = softmaxSplit(c.inputs[0].dims, c.attrs);
  Rows r;
  r.outer = s.outer;
  r.n = s.n;
  r.inner = s.inner;
  return r;
}

constexpr int kRowThreads = 256;

// Mode 0: softmax, 1: log-softmax.
template <int Mode, typename T> __global__ void softmaxKernel(Rows rows, const T *px, T *py) {
  using C = Compute<T>;
  for (int64_t r = blockIdx.x; r < rows.outer * rows.inner; r += gridDim.x) {
    const T *x = px + rows.base(r);
    T *y = py + rows.base(r);
    C mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x) mx = MaxOp()(mx, load(x[j * rows.inner]));
    mx = blockReduce(mx, MaxOp(), C(-INFINITY));
    if (!(mx > -INFINITY && mx < INFINITY) && mx == mx) mx = 0; // an all -inf row: exps are 0, as on the CPU
    double sum = 0;
    for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x) sum += double(std::exp(load(x[j * rows.inner]) - mx));
    sum = blockReduce(sum, SumOp(), 0.0);
    if (Mode == 0) {
      C inv = C(1.0 / sum);
      for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x)
        y[j * rows.inner] = store<T>(std::exp(load(x[j * rows.inner]) - mx) * inv);
    } else {
      C ls = C(std::log(sum));
      for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x)
        y[j * rows.inner] = store<T>(load(x[j * rows.inner]) - mx - ls);
    }
  }
}

// Mode 0: dx = y * (dy - sum(dy * y)); 1: dx = dy - exp(y) * sum(dy), y the forward's output.
template <int Mode, typename T> __global__ void softmaxGradKernel(Rows rows, const T *pdy, const T *py, T *pdx) {
  using C = Compute<T>;
  for (int64_t r = blockIdx.x; r < rows.outer * rows.inner; r += gridDim.x) {
    int64_t b = rows.base(r);
    const T *dy = pdy + b, *y = py + b;
    T *dx = pdx + b;
    double s = 0;
    for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x) {
      double g = double(load(dy[j * rows.inner]));
      s += Mode == 0 ? g * double(load(y[j * rows.inner])) : g;
    }
    s = blockReduce(s, SumOp(), 0.0);
    for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x) {
      C g = load(dy[j * rows.inner]), yv = load(y[j * rows.inner]);
      dx[j * rows.inner] = store<T>(Mode == 0 ? yv * (g - C(s)) : g - std::exp(yv) * C(s));
    }
  }
}

// Hardmax: one thread per row, 1 at the row's first maximum (a NaN never
// wins; a row of NaN or -inf only marks its first element), as on the CPU.
template <typename T> __global__ void hardmaxKernel(Rows rows, const T *px, T *py) {
  using C = Compute<T>;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows.outer * rows.inner;
       r += int64_t(gridDim.x) * blockDim.x) {
    const T *x = px + rows.base(r);
    T *y = py + rows.base(r);
    C mx = -INFINITY;
    int64_t arg = 0;
    for (int64_t j = 0; j < rows.n; ++j)
      if (load(x[j * rows.inner]) > mx) {
        mx = load(x[j * rows.inner]);
        arg = j;
      }
    for (int64_t j = 0; j < rows.n; ++j) y[j * rows.inner] = store<T>(C(j == arg));
  }
}

Status hardmax(const KernelContext &c) {
  Rows rows = rowsOf(c);
  if (rows.outer * rows.inner * rows.n == 0) return Status::ok();
  return dispatchFloatStorage(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    hardmaxKernel<T><<<blocksFor(rows.outer * rows.inner), kThreads, 0, streamOf(c)>>>(rows, c.inputs[0].as<T>(),
                                                                                      c.outputs[0].as<T>());
    return launchStatus("Hardmax");
  });
}

unsigned rowBlocks(const Rows &r) { return unsigned(std::min<int64_t>(r.outer * r.inner, int64_t(1) << 20)); }

template <int Mode> Status softmax(const KernelContext &c) {
  Rows rows = rowsOf(c);
  if (rows.outer * rows.inner * rows.n == 0) return Status::ok();
  return dispatchFloatStorage(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    softmaxKernel<Mode, T><<<rowBlocks(rows), kRowThreads, 0, streamOf(c)>>>(rows, c.inputs[0].as<T>(),
                                                                             c.outputs[0].as<T>());
    return launchStatus(Mode == 0 ? "Softmax" : "LogSoftmax");
  });
}

template <int Mode> Status softmaxGrad(const KernelContext &c) {
  Rows rows = rowsOf(c);
  if (rows.outer * rows.inner * rows.n == 0) return Status::ok();
  return dispatchFloatStorage(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    softmaxGradKernel<Mode, T><<<rowBlocks(rows), kRowThreads, 0, streamOf(c)>>>(
        rows, c.inputs[0].as<T>(), c.inputs[1].as<T>(), c.outputs[0].as<T>());
    return launchStatus(Mode == 0 ? "SoftmaxGrad" : "LogSoftmaxGrad");
  });
}

} // namespace

void registerSoftmaxKernels() {
  registerKernel("Softmax", softmax<0>, floatStorage());
  registerKernel("LogSoftmax", softmax<1>, floatStorage());
  registerKernel("Hardmax", hardmax, floatStorage());
  registerKernel("SoftmaxGrad", softmaxGrad<0>, floatStorage());
  registerKernel("LogSoftmaxGrad", softmaxGrad<1>, floatStorage());
}

} // namespace sd::cuda
