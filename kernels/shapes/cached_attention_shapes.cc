// Shape rule of CachedAttention (sd-kv-cache's causal attention through a
// key/value cache): q [B, H, T, d], k [B, Hkv, T, d], v [B, Hkv, T, dv],
// caches [B, Hkv, L, d] and [B, Hkv, L, dv], positions i64 [B, T]; H is a
// multiple of Hkv. Results: [B, H, T, dv] and the two updated caches.
#include "shape_util.h"

namespace sd {

static Status cachedAttentionShape(ShapeContext &c) {
  const TensorInfo &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &kc = c.inputs[3], &vc = c.inputs[4],
                   &pos = c.inputs[5];
  SD_CHECK_ARG(q.dtype == DType::F32 && k.dtype == q.dtype && v.dtype == q.dtype && kc.dtype == q.dtype &&
                   vc.dtype == q.dtype,
               "CachedAttention takes f32 queries, keys, values and caches");
  SD_CHECK_ARG(q.rank() == 4 && k.rank() == 4 && v.rank() == 4 && kc.rank() == 4 && vc.rank() == 4,
               "CachedAttention takes [B, heads, T, d] operands and [B, kv_heads, L, d] caches");
  SD_CHECK_ARG(q.isStatic() && k.isStatic() && v.isStatic() && kc.isStatic() && vc.isStatic() && pos.isStatic(),
               "CachedAttention needs static shapes");
  const int64_t b = q.dims[0], h = q.dims[1], t = q.dims[2], d = q.dims[3], hkv = k.dims[1], dv = v.dims[3],
                len = kc.dims[2];
  SD_CHECK_ARG(k.dims == Dims({b, hkv, t, d}), "CachedAttention's keys must be [", b, ", kv_heads, ", t, ", ", d,
               "], got ", formatDims(k.dims));
  SD_CHECK_ARG(hkv > 0 && h % hkv == 0, "CachedAttention's ", h, " query heads are not a multiple of its ", hkv,
               " key/value heads");
  SD_CHECK_ARG(v.dims[0] == b && v.dims[1] == hkv && v.dims[2] == t, "CachedAttention's values must be [", b, ", ",
               hkv, ", ", t, ", dv], got ", formatDims(v.dims));
  SD_CHECK_ARG(kc.dims == Dims({b, hkv, len, d}) && vc.dims == Dims({b, hkv, len, dv}) && len > 0,
               "CachedAttention's caches must be [", b, ", ", hkv, ", L, ", d, "] and [", b, ", ", hkv, ", L, ", dv,
               "], got ", formatDims(kc.dims), " and ", formatDims(vc.dims));
  SD_CHECK_ARG(pos.dtype == DType::I64 && pos.dims == Dims({b, t}), "CachedAttention's positions must be int64 [", b,
               ", ", t, "], got ", dtypeName(pos.dtype), "[", formatDims(pos.dims), "]");
  c.outputs = {TensorInfo{q.dtype, {b, h, t, dv}}, kc, vc};
  return Status::ok();
}

void registerCachedAttentionShapes() { registerShapeRule("CachedAttention", cachedAttentionShape); }

} // namespace sd
