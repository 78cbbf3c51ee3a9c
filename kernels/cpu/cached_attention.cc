// CPU kernel of CachedAttention (see SDOps.td): causal attention of this
// step's tokens over a per-row key/value cache. The step's keys and values
// are written into the cache slots their positions name first, then each
// (row, head, token) query attends to slots 0..position, so a prefill chunk
// sees its own earlier tokens and a decode token everything before it.
// The updated caches are normally the input caches themselves (the plan
// stores them in place); when they are not, the inputs are copied first.
#include "cpu_util.h"
#include "vecmath.h"
#include <cmath>
#include <cstring>

namespace sd::cpu {
namespace {

float dot(const float *a, const float *b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}; // independent sums the compiler can keep in one vector register
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

Status CachedAttentionKernel(const KernelContext &c) {
  const TensorView &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &kcIn = c.inputs[3], &vcIn = c.inputs[4];
  const int64_t *pos = c.inputs[5].as<int64_t>();
  TensorView &out = const_cast<TensorView &>(c.outputs[0]);
  const TensorView &kc = c.outputs[1], &vc = c.outputs[2];
  const int64_t batch = q.dims[0], heads = q.dims[1], steps = q.dims[2], d = q.dims[3];
  const int64_t kvHeads = k.dims[1], dv = v.dims[3], len = kc.dims[2], group = heads / kvHeads;
  const float scale = float(c.attrs.getFloat("scale", 1.0 / std::sqrt(double(d))));
  int64_t span = 0; // the most keys a query reads
  for (int64_t i = 0; i < batch * steps; ++i) {
    if (pos[i] < 0 || pos[i] >= len)
      return sdError("CachedAttention: position ", pos[i], " (row ", i / steps, ", token ", i % steps,
                     ") is outside the key/value cache of ", len, " positions");
    span = std::max(span, pos[i] + 1);
  }
  if (kc.data != kcIn.data) std::memcpy(kc.data, kcIn.data, size_t(kc.numElements()) * sizeof(float));
  if (vc.data != vcIn.data) std::memcpy(vc.data, vcIn.data, size_t(vc.numElements()) * sizeof(float));
  float *pkc = kc.as<float>(), *pvc = vc.as<float>();
  const float *pk = k.as<float>(), *pv = v.as<float>(), *pq = q.as<float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < kvHeads; ++h)
      for (int64_t t = 0; t < steps; ++t) {
        const int64_t slot = pos[b * steps + t], bh = b * kvHeads + h;
        std::memcpy(pkc + (bh * len + slot) * d, pk + (bh * steps + t) * d, size_t(d) * sizeof(float));
        std::memcpy(pvc + (bh * len + slot) * dv, pv + (bh * steps + t) * dv, size_t(dv) * sizeof(float));
      }
  float *py = out.as<float>();
  const int64_t items = batch * heads * steps;
  // A decode step's queries read a few thousand values each: handing them to
  // other threads costs more than that below about 2^18 multiply-adds each.
  const int64_t perItem = std::max<int64_t>(span * (d + dv), 1);
  parallelFor(c.pool, items, std::max<int64_t>(1, (int64_t(1) << 18) / perItem), [&](int64_t i0, int64_t i1) {
    std::vector<float> p(static_cast<size_t>(len));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i % steps, h = (i / steps) % heads, b = i / (steps * heads);
      const int64_t last = pos[b * steps + t], bh = b * kvHeads + h / group;
      const float *qi = pq + i * d, *keys = pkc + bh * len * d, *values = pvc + bh * len * dv;
      for (int64_t j = 0; j <= last; ++j) p[size_t(j)] = dot(qi, keys + j * d, d) * scale;
      vsoftmaxRow(p.data(), p.data(), last + 1);
      float *y = py + i * dv;
      std::fill(y, y + dv, 0.0f);
      for (int64_t j = 0; j <= last; ++j) {
        const float w = p[size_t(j)], *vj = values + j * dv;
        for (int64_t e = 0; e < dv; ++e) y[e] += w * vj[e];
      }
    }
  });
  return Status::ok();
}

} // namespace

void registerCachedAttentionKernels() { registerCpuKernel("CachedAttention", CachedAttentionKernel, TypeSet{DType::F32}); }

} // namespace sd::cpu
