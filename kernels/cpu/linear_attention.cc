// ONNX LinearAttention (opset 27) on CPU, as onnx/reference computes it: per
// (batch, kv head) a d_k x d_v state, decayed by exp(decay) (gated rules),
// corrected by the delta rule v <- beta (v - S^T k) (delta rules), updated by
// k v^T, and read by every query head of the group: o = scale q^T S. Halves
// run through f32 (register.cc), as the reference accumulates in f32.
#include "cpu_util.h"
#include <cmath>
#include <type_traits>
#include <vector>

namespace sd::cpu {
namespace {

template <typename T> Status linearAttention(const KernelContext &c) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>; // f32 state, as the reference; f64 kept
  const TensorView &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  const TensorView *past = c.hasInput(3) ? &c.inputs[3] : nullptr;
  const TensorView *decay = c.hasInput(4) ? &c.inputs[4] : nullptr;
  const TensorView *beta = c.hasInput(5) ? &c.inputs[5] : nullptr;
  int64_t hq = c.attrs.getInt("q_num_heads", 0), hkv = c.attrs.getInt("kv_num_heads", 0);
  int64_t batch = q.dims[0], steps = q.dims[1], dk = q.dims[2] / hq, dv = v.dims[2] / hkv, group = hq / hkv;
  double scaleAttr = c.attrs.getFloat("scale", 0.0);
  float scale = scaleAttr == 0.0 ? float(1.0 / std::sqrt(double(dk))) : float(scaleAttr);
  int64_t decayLast = decay ? decay->dims[2] : 0, betaLast = beta ? beta->dims[2] : 0;
  const T *pq = q.as<T>(), *pk = k.as<T>(), *pv = v.as<T>();
  T *out = c.outputs[0].as<T>(), *present = c.outputs[1].as<T>();
  parallelFor(c.pool, batch * hkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<Acc> state(static_cast<size_t>(dk * dv)), vt(static_cast<size_t>(dv));
    for (int64_t bh = lo; bh < hi; ++bh) {
      int64_t b = bh / hkv, h = bh % hkv;
      for (int64_t i = 0; i < dk * dv; ++i) state[size_t(i)] = past ? Acc(past->as<T>()[bh * dk * dv + i]) : Acc(0);
      for (int64_t t = 0; t < steps; ++t) {
        const T *kt = pk + (b * steps + t) * hkv * dk + h * dk;
        const T *vrow = pv + (b * steps + t) * hkv * dv + h * dv;
        if (decay) {
          const T *g = decay->as<T>() + (b * steps + t) * decayLast;
          for (int64_t d = 0; d < dk; ++d) {
            Acc f = std::exp(Acc(decayLast == hkv ? g[h] : g[h * dk + d]));
            for (int64_t m = 0; m < dv; ++m) state[size_t(d * dv + m)] *= f;
          }
        }
        for (int64_t m = 0; m < dv; ++m) vt[size_t(m)] = Acc(vrow[m]);
        if (beta) {
          Acc bt = Acc(beta->as<T>()[(b * steps + t) * betaLast + (betaLast == 1 ? 0 : h)]);
          for (int64_t m = 0; m < dv; ++m) {
            Acc retrieved = 0;
            for (int64_t d = 0; d < dk; ++d) retrieved += state[size_t(d * dv + m)] * Acc(kt[d]);
            vt[size_t(m)] = bt * (vt[size_t(m)] - retrieved);
          }
        }
        for (int64_t d = 0; d < dk; ++d)
          for (int64_t m = 0; m < dv; ++m) state[size_t(d * dv + m)] += Acc(kt[d]) * vt[size_t(m)];
        for (int64_t g = 0; g < group; ++g) {
          int64_t head = h * group + g;
          const T *qt = pq + (b * steps + t) * hq * dk + head * dk;
          T *o = out + (b * steps + t) * hq * dv + head * dv;
          for (int64_t m = 0; m < dv; ++m) {
            Acc acc = 0;
            for (int64_t d = 0; d < dk; ++d) acc += Acc(qt[d]) * state[size_t(d * dv + m)];
            o[m] = T(Acc(scale) * acc);
          }
        }
      }
      for (int64_t i = 0; i < dk * dv; ++i) present[bh * dk * dv + i] = T(state[size_t(i)]);
    }
  });
  return Status::ok();
}

Status LinearAttentionKernel(const KernelContext &c) {
  SD_CHECK_ARG(c.outputs[1].dtype == c.inputs[0].dtype, "LinearAttention's state must have the query's type");
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) { return linearAttention<decltype(tag)>(c); });
}

} // namespace

void registerLinearAttentionKernels() {
  registerCpuKernel("LinearAttention", LinearAttentionKernel, TypeSet::floats());
}

} // namespace sd::cpu
