// CPU kernels for NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss
// (log-softmax over axis 1, then NLL), with class weights, ignore_index and
// mean/sum/none reductions as the ONNX reference defines them.
#include "cpu_util.h"
#include "half_convert.h"
#include "vecmath.h"
#include <type_traits>
#include <cmath>

namespace sd::cpu {
namespace {

// loss[n, d] = -w[t] * logp[n, t, d]; reduced per `reduction`.
template <typename T>
Status nll(const KernelContext &c, const T *logp, const Dims &xdims) {
  const TensorView &tgt = c.inputs[1], &out = c.outputs[0];
  int64_t n = xdims[0], cls = xdims[1], inner = 1;
  for (size_t d = 2; d < xdims.size(); ++d) inner *= xdims[d];
  std::vector<int64_t> t;
  SD_CHECK_ARG(readIntegers(tgt, t), "loss target must be integer");
  bool hasIgnore = c.attrs.has("ignore_index");
  int64_t ignore = c.attrs.getInt("ignore_index", 0);
  const T *w = c.hasInput(2) && c.inputs[2].data ? c.inputs[2].as<T>() : nullptr;
  std::string red = c.attrs.getString("reduction", "mean");
  bool none = red == "none";
  SD_CHECK_ARG(out.numElements() == (none ? n * inner : 1), "loss output size mismatch");
  double sum = 0, wsum = 0;
  T *po = out.as<T>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < inner; ++j) {
      int64_t k = t[size_t(i * inner + j)];
      double l = 0, wk = 0;
      if (!(hasIgnore && k == ignore)) {
        if (k < 0 || k >= cls) return sdError("loss target ", k, " out of range [0, ", cls, ")");
        wk = w ? double(w[k]) : 1.0;
        l = -wk * double(logp[(i * cls + k) * inner + j]);
      }
      if (none) po[i * inner + j] = T(l);
      sum += l;
      wsum += wk;
    }
  if (red == "sum") po[0] = T(sum);
  else if (red == "mean") po[0] = T((w || hasIgnore) ? sum / wsum : sum / double(n * inner));
  return Status::ok();
}

Status NllKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return nll<T>(c, c.inputs[0].as<T>(), c.inputs[0].dims);
  });
}

Status sceF(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t n = x.dims[0], cls = x.dims[1], inner = x.numElements() / std::max<int64_t>(n * cls, 1);
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> scratch;
    T *logp;
    if (c.outputs.size() > 1 && c.outputs[1].data) {
      logp = c.outputs[1].as<T>();
    } else {
      scratch.resize(size_t(x.numElements()));
      logp = scratch.data();
    }
    const T *px = x.as<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (inner == 1) { // class rows contiguous: the vector exp loop, rows across threads
        parallelFor(c.pool, n, std::max<int64_t>(1, 4096 / std::max<int64_t>(cls, 1)), [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            const float *row = px + i * cls;
            float *out = logp + i * cls, mx = vmax(row, cls);
            float shift = mx + std::log(vexpShiftSum(row, out, cls, mx));
            for (int64_t k = 0; k < cls; ++k) out[k] = row[k] - shift;
          }
        });
        return nll<T>(c, logp, x.dims);
      }
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) {
        const T *row = px + i * cls * inner + j;
        T mx = row[0];
        for (int64_t k = 1; k < cls; ++k) mx = std::max(mx, row[k * inner]);
        double s = 0;
        for (int64_t k = 0; k < cls; ++k) s += std::exp(double(row[k * inner] - mx));
        T ls = T(std::log(s));
        for (int64_t k = 0; k < cls; ++k) logp[(i * cls + k) * inner + j] = row[k * inner] - mx - ls;
      }
    return nll<T>(c, logp, x.dims);
  });
}

// Backward of SoftmaxCrossEntropyLoss (no class weights) for its scalar
// reductions: dlogits = (softmax(logits) - onehot(label)) * dloss, divided by
// the counted targets for "mean"; ignored targets get zero rows.
Status sceGradF(const KernelContext &c) {
  const TensorView &x = c.inputs[1];
  int64_t n = x.dims[0], cls = x.dims[1], inner = x.numElements() / std::max<int64_t>(n * cls, 1);
  std::vector<int64_t> t;
  SD_CHECK_ARG(readIntegers(c.inputs[2], t), "loss target must be integer");
  SD_CHECK_ARG(int64_t(t.size()) == n * inner, "loss target size mismatch");
  bool hasIgnore = c.attrs.has("ignore_index");
  int64_t ignore = c.attrs.getInt("ignore_index", 0);
  int64_t counted = 0;
  for (int64_t k : t) {
    if (hasIgnore && k == ignore) continue;
    if (k < 0 || k >= cls) return sdError("loss target ", k, " out of range [0, ", cls, ")");
    ++counted;
  }
  bool mean = c.attrs.getString("reduction", "mean") == "mean";
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    T dl = c.inputs[0].as<T>()[0];
    if (mean) dl = counted ? T(dl / T(counted)) : T(0);
    const T *px = x.as<T>();
    T *pd = c.outputs[0].as<T>();
    parallelFor(c.pool, n * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(cls, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t i = r / inner, j = r % inner, k = t[size_t(r)];
        const T *row = px + i * cls * inner + j;
        T *drow = pd + i * cls * inner + j;
        if (hasIgnore && k == ignore) {
          for (int64_t q = 0; q < cls; ++q) drow[q * inner] = 0;
          continue;
        }
        if constexpr (std::is_same_v<T, float>) {
          if (inner == 1) { // contiguous class row: the vector exp loop
            float mx = vmax(row, cls), scale = dl / vexpShiftSum(row, drow, cls, mx);
            for (int64_t q = 0; q < cls; ++q) drow[q] *= scale;
            drow[k] -= dl;
            continue;
          }
        }
        T mx = row[0];
        for (int64_t q = 1; q < cls; ++q) mx = std::max(mx, row[q * inner]);
        double s = 0;
        for (int64_t q = 0; q < cls; ++q) s += std::exp(double(row[q * inner] - mx));
        T inv = T(1.0 / s);
        for (int64_t q = 0; q < cls; ++q) drow[q * inner] = std::exp(row[q * inner] - mx) * inv * dl;
        drow[k * inner] -= dl;
      }
    });
    return Status::ok();
  });
}

// bf16/f16 scores: every half input (the scores, a half loss gradient)
// widened exactly into an f32 copy, the f32 kernel, and each half output
// computed in f32 and rounded as the Cast kernel rounds; an f32 output (the
// loss under f32_loss) is written as it is. So these steps give the bits of
// the plan that casts around the f32 step, as sd-half-elementwise assumes.
Status viaF32(const KernelContext &c, Status (*f32Kernel)(const KernelContext &)) {
  KernelContext f = c;
  std::vector<std::vector<float>> wideIn(c.inputs.size()), wideOut(c.outputs.size());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const TensorView &in = c.inputs[i];
    if (!in.data || !dtypeIsHalf(in.dtype)) continue;
    wideIn[i].resize(size_t(in.numElements()));
    widenHalf(in.dtype, in.as<uint16_t>(), wideIn[i].data(), in.numElements());
    f.inputs[i] = TensorView{wideIn[i].data(), DType::F32, in.dims};
  }
  for (size_t o = 0; o < c.outputs.size(); ++o)
    if (c.outputs[o].data && dtypeIsHalf(c.outputs[o].dtype)) {
      wideOut[o].resize(size_t(c.outputs[o].numElements()));
      f.outputs[o] = TensorView{wideOut[o].data(), DType::F32, c.outputs[o].dims};
    }
  SD_RETURN_IF_ERROR(f32Kernel(f));
  for (size_t o = 0; o < c.outputs.size(); ++o)
    if (!wideOut[o].empty())
      narrowHalf(c.outputs[o].dtype, wideOut[o].data(), c.outputs[o].as<uint16_t>(), c.outputs[o].numElements());
  return Status::ok();
}

Status SceKernel(const KernelContext &c) { return dtypeIsHalf(c.inputs[0].dtype) ? viaF32(c, sceF) : sceF(c); }

Status SceGradKernel(const KernelContext &c) {
  return dtypeIsHalf(c.inputs[1].dtype) ? viaF32(c, sceGradF) : sceGradF(c);
}

} // namespace

void registerLossKernels() {
  registerCpuKernel("NegativeLogLikelihoodLoss", NllKernel, TypeSet::floats());
  registerCpuKernel("SoftmaxCrossEntropyLoss", SceKernel, TypeSet::floats() | TypeSet::halves());
  registerCpuKernel("SoftmaxCrossEntropyLossGrad", SceGradKernel, TypeSet::floats() | TypeSet::halves());
}

} // namespace sd::cpu
