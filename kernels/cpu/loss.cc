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

// The value of a one-element float tensor (exact as a double).
double scalarOf(const TensorView &t) {
  if (dtypeIsHalf(t.dtype)) {
    float v = 0;
    widenHalf(t.dtype, t.as<uint16_t>(), &v, 1);
    return v;
  }
  double v = 0;
  (void)dispatchFloat(t.dtype, [&](auto tag) {
    v = double(t.as<decltype(tag)>()[0]);
    return Status::ok();
  });
  return v;
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
    T dl = T(scalarOf(c.inputs[0])); // f32 with half logits (sd-half-elementwise)
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

// bf16/f16 scores: widened exactly into f32, the f32 kernel, and its results
// rounded as the Cast kernel rounds (but an f32_loss loss). So these steps give
// the bits of the plan that cast the scores to f32 first, as
// sd-half-elementwise assumes.
TensorView widened(const TensorView &x, std::vector<float> &buf) {
  buf.resize(size_t(x.numElements()));
  widenHalf(x.dtype, x.as<uint16_t>(), buf.data(), x.numElements());
  return TensorView{buf.data(), DType::F32, x.dims};
}

Status SceKernel(const KernelContext &c) {
  if (!dtypeIsHalf(c.inputs[0].dtype)) return sceF(c);
  std::vector<float> scores;
  KernelContext f = c;
  f.inputs[0] = widened(c.inputs[0], scores);
  if (c.attrs.getInt("f32_loss", 0) != 0) return sceF(f);
  // ONNX's half loss and log_prob: the f32 ones, rounded.
  std::vector<std::vector<float>> wide(c.outputs.size());
  for (size_t o = 0; o < c.outputs.size(); ++o)
    if (c.outputs[o].data) {
      wide[o].resize(size_t(c.outputs[o].numElements()));
      f.outputs[o] = TensorView{wide[o].data(), DType::F32, c.outputs[o].dims};
    }
  SD_RETURN_IF_ERROR(sceF(f));
  for (size_t o = 0; o < c.outputs.size(); ++o)
    if (c.outputs[o].data) narrowHalf(c.outputs[o].dtype, wide[o].data(), c.outputs[o].as<uint16_t>(), c.outputs[o].numElements());
  return Status::ok();
}

Status SceGradKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[1], &dx = c.outputs[0];
  if (!dtypeIsHalf(x.dtype)) return sceGradF(c);
  std::vector<float> scores, grad(size_t(dx.numElements()));
  KernelContext f = c;
  f.inputs[1] = widened(x, scores);
  f.outputs[0] = TensorView{grad.data(), DType::F32, dx.dims};
  SD_RETURN_IF_ERROR(sceGradF(f));
  narrowHalf(dx.dtype, grad.data(), dx.as<uint16_t>(), dx.numElements());
  return Status::ok();
}

} // namespace

void registerLossKernels() {
  registerCpuKernel("NegativeLogLikelihoodLoss", NllKernel, TypeSet::floats());
  registerCpuKernel("SoftmaxCrossEntropyLoss", SceKernel, TypeSet::floats() | TypeSet::halves());
  registerCpuKernel("SoftmaxCrossEntropyLossGrad", SceGradKernel, TypeSet::floats() | TypeSet::halves());
}

} // namespace sd::cpu
