// CUDA kernels for Conv and FusedConv (bias, then the residual add and the
// activation of FusedConv's epilogue, as kernels/cpu/conv_epilogue.h),
// ConvTranspose and Conv's weight gradient: direct convolutions that
// accumulate in f32 (f64 for f64) in a fixed order, one thread per output
// element (a block per weight for the gradient). Correct for every group count
// (depthwise included), stride, dilation and padding; cuDNN comes later for speed.
#include "block_reduce.cuh"
#include "conv_shape.cuh"
#include "cuda_util.cuh"
#include "sd/ops/flat_window.h"
#include "sd/ops/math/activations.h"
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

namespace sd::cuda {
namespace {

enum class Act { None, Relu, Clip, HardSwish, HardSigmoid, LeakyRelu };

struct Epilogue {
  Act act = Act::None;
  double alpha = 0, beta = 0;
};

Epilogue epilogueOf(const AttrMap &attrs, DType t) {
  Epilogue e;
  std::string a = attrs.getString("activation", "");
  double lowest = t == DType::F64 ? -DBL_MAX : -FLT_MAX, highest = t == DType::F64 ? DBL_MAX : FLT_MAX;
  if (a == "Relu") e.act = Act::Relu;
  else if (a == "Clip") {
    e.act = Act::Clip;
    e.alpha = attrs.getFloat("activation_alpha", lowest);
    e.beta = attrs.getFloat("activation_beta", highest);
  } else if (a == "HardSwish") e.act = Act::HardSwish;
  else if (a == "HardSigmoid") {
    e.act = Act::HardSigmoid;
    e.alpha = attrs.getFloat("activation_alpha", 0.2);
    e.beta = attrs.getFloat("activation_beta", 0.5);
  } else if (a == "LeakyRelu") {
    e.act = Act::LeakyRelu;
    e.alpha = attrs.getFloat("activation_alpha", 0.01);
  }
  return e;
}

// The CPU epilogue's math (the activations' shared functions), so NaN passes through alike.
template <typename C> __device__ C activate(const Epilogue &e, C y) {
  switch (e.act) {
  case Act::None: return y;
  case Act::Relu: return y > C(0) || y != y ? y : C(0);
  case Act::Clip: {
    C lo = C(e.alpha), hi = C(e.beta);
    C v = y < lo ? lo : y; // std::max(y, lo)
    return hi < v ? hi : v; // std::min(v, hi)
  }
  case Act::HardSwish: return math::hardSwish(y);
  case Act::HardSigmoid: return math::hardSigmoid(y, C(e.alpha), C(e.beta));
  case Act::LeakyRelu: return math::leakyRelu(y, C(e.alpha));
  }
  return y;
}

template <typename T>
__global__ void convKernel(ConvShape s, FlatWindow w, Epilogue e, const T *x, const T *wt, const T *bias,
                           const T *residual, T *y) {
  using C = Compute<T>;
  int64_t total = s.n * s.m * w.outTotal;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t oo = i % w.outTotal, rest = i / w.outTotal, oc = rest % s.m, img = rest / s.m;
    int64_t grp = oc / s.mg;
    C acc = 0;
    for (int64_t c = 0; c < s.cg; ++c) {
      const T *plane = x + (img * s.cin + grp * s.cg + c) * w.inTotal;
      const T *taps = wt + (oc * s.cg + c) * w.kernelTotal;
      for (int64_t kk = 0; kk < w.kernelTotal; ++kk) {
        int64_t off = w.tap(oo, kk);
        if (off >= 0) acc += load(plane[off]) * load(taps[kk]);
      }
    }
    if (bias) acc += load(bias[oc]);
    if (residual) acc += load(residual[i]);
    y[i] = store<T>(activate(e, acc));
  }
}

// x, w, bias?, residual? (FusedConv) -> y.
Status ConvKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &wt = c.inputs[1], &y = c.outputs[0];
  WindowGeometry g;
  Dims kernel = c.attrs.getInts("kernel_shape");
  if (kernel.empty()) kernel.assign(wt.dims.begin() + 2, wt.dims.end());
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, Dims(x.dims.begin() + 2, x.dims.end()), kernel, false, g));
  StatusOr<FlatWindow> w = flatWindowOf(g);
  if (!w.isOk()) return w.status();
  StatusOr<ConvShape> shape = convShapeOf(c, x, wt.dims[0], "Conv");
  if (!shape.isOk()) return shape.status();
  const ConvShape s = shape.value();
  if (wt.dims[1] != s.cg || y.dims[1] != s.m) return sdError("Conv shapes inconsistent");
  int64_t total = y.numElements();
  if (total == 0) return Status::ok();
  Epilogue e = epilogueOf(c.attrs, x.dtype);
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *bias = c.hasInput(2) && c.inputs[2].data ? c.inputs[2].as<T>() : nullptr;
    const T *residual = c.hasInput(3) && c.inputs[3].data ? c.inputs[3].as<T>() : nullptr;
    convKernel<T><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(s, *w, e, x.as<T>(), wt.as<T>(), bias, residual,
                                                                 y.as<T>());
    return launchStatus("Conv");
  });
}

// ConvTranspose as a gather: output position oo of the transposed conv is
// the forward conv's input position, and `w` its forward geometry (w.in: the
// output, w.out: the input), so its taps come from FlatWindow::reachedBy.
// One thread per output element: the bias, then every (tap, input channel)
// that reaches it. Weights are [C_in, C_out / group, kernel...].
template <typename T>
__global__ void convTransposeKernel(ConvShape s, FlatWindow w, const T *x, const T *wt, const T *bias, T *y) {
  using C = Compute<T>;
  const int64_t total = s.n * s.m * w.inTotal;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t oo = i % w.inTotal, rest = i / w.inTotal, oc = rest % s.m, img = rest / s.m;
    const int64_t grp = oc / s.mg, j = oc % s.mg;
    C acc = bias ? load(bias[oc]) : C(0);
    for (int64_t kk = 0; kk < w.kernelTotal; ++kk) {
      const int64_t src = w.reachedBy(oo, kk);
      if (src < 0) continue;
      for (int64_t c = 0; c < s.cg; ++c) {
        const int64_t ic = grp * s.cg + c;
        acc += load(x[(img * s.cin + ic) * w.outTotal + src]) * load(wt[(ic * s.mg + j) * w.kernelTotal + kk]);
      }
    }
    y[i] = store<T>(acc);
  }
}

// x, w, bias? -> y.
Status ConvTransposeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &wt = c.inputs[1], &y = c.outputs[0];
  Dims kernel = c.attrs.getInts("kernel_shape");
  if (kernel.empty()) kernel.assign(wt.dims.begin() + 2, wt.dims.end());
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveTransposedWindows(c.attrs, Dims(x.dims.begin() + 2, x.dims.end()), kernel, g));
  WindowGeometry fwd = g; // the forward conv whose input gradient this is
  fwd.in = g.out;
  fwd.out = g.in;
  StatusOr<FlatWindow> w = flatWindowOf(fwd);
  if (!w.isOk()) return w.status();
  ConvShape s;
  s.n = x.dims[0];
  s.cin = x.dims[1];
  s.group = c.attrs.getInt("group", 1);
  if (s.group <= 0 || s.cin % s.group) return sdError("ConvTranspose group does not divide the channels");
  s.cg = s.cin / s.group;
  s.mg = wt.dims[1];
  s.m = s.mg * s.group;
  if (wt.dims[0] != s.cin || y.dims[1] != s.m) return sdError("ConvTranspose shapes inconsistent");
  const int64_t total = y.numElements();
  if (total == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *bias = c.hasInput(2) && c.inputs[2].data ? c.inputs[2].as<T>() : nullptr;
    convTransposeKernel<T><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(s, *w, x.as<T>(), wt.as<T>(), bias,
                                                                          y.as<T>());
    return launchStatus("ConvTranspose");
  });
}

// Conv's weight gradient, one block per weight element (output channel,
// input channel of its group, tap): the block sums dy * x over every batch
// item and output position in a fixed tree (block_reduce.cuh), so replay
// equals eager with no atomics. Direct like the forward; cuDNN later for speed.
template <typename T>
__global__ void convGradWeightKernel(ConvShape s, FlatWindow w, const T *dy, const T *x, T *dw) {
  using C = Compute<T>;
  const int64_t weights = s.m * s.cg * w.kernelTotal, terms = s.n * w.outTotal;
  for (int64_t e = blockIdx.x; e < weights; e += gridDim.x) {
    const int64_t kk = e % w.kernelTotal, rest = e / w.kernelTotal, c = rest % s.cg, oc = rest / s.cg;
    const int64_t ic = oc / s.mg * s.cg + c;
    C acc = 0;
    for (int64_t r = threadIdx.x; r < terms; r += blockDim.x) {
      const int64_t oo = r % w.outTotal, img = r / w.outTotal;
      const int64_t off = w.tap(oo, kk);
      if (off >= 0) acc += load(dy[(img * s.m + oc) * w.outTotal + oo]) * load(x[(img * s.cin + ic) * w.inTotal + off]);
    }
    acc = blockReduce(acc, SumOp(), C(0));
    if (threadIdx.x == 0) dw[e] = store<T>(acc);
  }
}

// dy [N, M, out...], x [N, C, in...] {conv attributes, kernel_shape} -> dW [M, C / group, kernel...].
Status ConvGradWeightKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &x = c.inputs[1], &dw = c.outputs[0];
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, Dims(x.dims.begin() + 2, x.dims.end()), c.attrs.getInts("kernel_shape"),
                                    false, g));
  StatusOr<FlatWindow> w = flatWindowOf(g);
  if (!w.isOk()) return w.status();
  StatusOr<ConvShape> shape = convShapeOf(c, x, dy.dims[1], "ConvGradWeight");
  if (!shape.isOk()) return shape.status();
  const ConvShape s = shape.value();
  if (Dims(dy.dims.begin() + 2, dy.dims.end()) != g.out || dw.dims[0] != s.m || dw.dims[1] != s.cg)
    return sdError("ConvGradWeight shapes inconsistent");
  const int64_t weights = dw.numElements();
  if (weights == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    convGradWeightKernel<T><<<unsigned(std::min<int64_t>(weights, 1 << 20)), kThreads, 0, streamOf(c)>>>(
        s, *w, dy.as<T>(), x.as<T>(), dw.as<T>());
    return launchStatus("ConvGradWeight");
  });
}

} // namespace

void registerConvKernels() {
  registerKernel("Conv", ConvKernel, floatStorage());
  registerKernel("FusedConv", ConvKernel, floatStorage());
  registerKernel("ConvTranspose", ConvTransposeKernel, floatStorage());
  registerKernel("ConvGradWeight", ConvGradWeightKernel, floatStorage());
}

} // namespace sd::cuda
