// ONNX LinearAttention's (opset 27) recurrence, one state column at a time,
// shared by the CPU and CUDA kernels: per (batch, kv head) a d_k x d_v state
// S, decayed by exp(decay) (gated rules), corrected by the delta rule
// v <- beta (v - S^T k) (delta rules), updated by k v^T and read by every
// query head of the group, o = scale q^T S. Every operation of a step on
// column m of S reads and writes column m alone, so columns are independent:
// the CUDA kernel gives each its own thread, the CPU walks them in turn. f32
// state and sums for f32 and halves, as onnx/reference accumulates; f64 kept.
#pragma once
#include "sd/format/tensor.h"
#include "sd/ops/attrs.h"
#include "sd/ops/math/host_device.h"
#include <cmath>
#include <cstdint>

namespace sd::math {

struct LinearAttentionShape {
  int64_t batch, steps, hq, hkv, dk, dv;
  int64_t decayLast, betaLast; // decay's last dim (hkv: per head, hkv*dk: per key dim), beta's (1 or hkv); 0: absent
  float scale;
};

// The shape of a node with 3-D q [B, T, hq * dk] and v [B, T, hkv * dv] and
// decay and beta's last dims (0: absent); scale defaults to 1 / sqrt(dk).
inline LinearAttentionShape linearAttentionShapeOf(const AttrMap &attrs, const Dims &q, const Dims &v,
                                                   int64_t decayLast, int64_t betaLast) {
  const int64_t hq = attrs.getInt("q_num_heads", 0), hkv = attrs.getInt("kv_num_heads", 0), dk = q[2] / hq;
  const double scale = attrs.getFloat("scale", 0.0);
  return {q[0], q[1], hq, hkv, dk, v[2] / hkv, decayLast, betaLast,
          scale == 0.0 ? float(1.0 / std::sqrt(double(dk))) : float(scale)};
}

// The operands of one (batch, kv head) pair: 3-D [B, T, heads * d] inputs.
template <typename T> struct LinearAttentionOperands {
  const T *q, *k, *v, *decay, *beta; // decay, beta: null when the rule has none
  T *out;
};

// exp(decay) of key dim d at step row `row` for kv head h: computed on the
// spot (the CUDA threads, one per column) or read from a per-step table (the
// CPU, which walks every column of a step).
template <typename T> struct ExpDecay {
  const T *decay;
  int64_t last, hkv, dk;
  template <typename Acc> SD_HD Acc at(int64_t row, int64_t h, int64_t d) const {
    const T *g = decay + row * last;
    return std::exp(Acc(last == hkv ? g[h] : g[h * dk + d]));
  }
};

// Step `t` of column m of head pair (b, h): s is the column's first element,
// its d_k entries `stride` apart. decayAt(row, h, d) gives exp(decay).
template <typename T, typename Acc, typename Decay>
SD_HD void linearAttentionStep(const LinearAttentionShape &g, const LinearAttentionOperands<T> &x, int64_t b,
                               int64_t h, int64_t t, int64_t m, Acc *s, int64_t stride, const Decay &decayAt) {
  const int64_t row = b * g.steps + t, group = g.hq / g.hkv;
  const T *kt = x.k + row * g.hkv * g.dk + h * g.dk;
  if (x.decay)
    for (int64_t d = 0; d < g.dk; ++d) s[d * stride] *= decayAt.template at<Acc>(row, h, d);
  Acc vt = Acc(x.v[row * g.hkv * g.dv + h * g.dv + m]);
  if (x.beta) {
    const Acc bt = Acc(x.beta[row * g.betaLast + (g.betaLast == 1 ? 0 : h)]);
    Acc retrieved = 0;
    for (int64_t d = 0; d < g.dk; ++d) retrieved += s[d * stride] * Acc(kt[d]);
    vt = bt * (vt - retrieved);
  }
  for (int64_t d = 0; d < g.dk; ++d) s[d * stride] += Acc(kt[d]) * vt;
  for (int64_t j = 0; j < group; ++j) {
    const int64_t head = h * group + j;
    const T *qt = x.q + row * g.hq * g.dk + head * g.dk;
    Acc acc = 0;
    for (int64_t d = 0; d < g.dk; ++d) acc += Acc(qt[d]) * s[d * stride];
    x.out[row * g.hq * g.dv + head * g.dv + m] = T(Acc(g.scale) * acc);
  }
}

} // namespace sd::math
