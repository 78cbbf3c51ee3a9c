// Helpers shared by the shape rules.
#pragma once
#include "sd/ops/registry.h"
#include <initializer_list>

namespace sd {

// Multidirectional (numpy) broadcast of several shapes; unknown dims stay unknown
// unless the other side pins them.
Status broadcastDims(const std::vector<const TensorInfo *> &ins, TensorInfo &out);
// Normalizes a possibly negative axis against a rank; error if out of range.
Status normalizeAxis(int64_t &axis, int64_t rank, const char *what = "axis");
inline TensorInfo sameAs(const TensorInfo &t, DType dt) {
  TensorInfo r = t;
  r.dtype = dt;
  return r;
}
inline TensorInfo unknownRank(DType dt) {
  TensorInfo r;
  r.dtype = dt;
  r.rankKnown = false;
  return r;
}
// Attention's optional packed-sequence positions: i64 [B, T] for q [B, ..., T, d]
// with as many keys as queries (self-attention).
Status checkAttentionPositions(const TensorInfo &q, const TensorInfo &kt, const TensorInfo &positions,
                               bool tokenMajor = false);
// The result type of an op whose attribute `out_type` (sd-half-elementwise)
// rounds its f32 result to bf16 or f16, or keeps the f32 result of a half
// input: that type, else `x`'s.
Status roundedResultType(const AttrMap &attrs, DType x, const char *op, DType &result);
// Attention's layout "bshd" (q [B, T, H, d], k [B, S, Hkv, d], v [B, S, Hkv,
// dv]): checks the operands and gives the scores' [B, H, T, S] and the
// output's [B, T, H, dv] dims.
Status tokenMajorAttentionDims(const TensorInfo &q, const TensorInfo &k, const TensorInfo &v, Dims &scores, Dims &out);
// Attention's row statistics (one per query row: its lse result, AttentionGrad's
// lse operand) from the output's dims: [..., T], or [B, H, T] in layout bshd.
Dims attentionRowDims(const Dims &out, bool tokenMajor);
// QkvAttention's qkv [B, T, H + 2 Hkv, d] (`kv_heads` = Hkv) as the q
// [B, T, H, d], k and v [B, T, Hkv, d] of layout bshd it holds.
Status qkvAttentionParts(const TensorInfo &qkv, const AttrMap &attrs, TensorInfo &q, TensorInfo &k, TensorInfo &v);
void registerShapeRule(const char *op, ShapeFn fn);
// Checks a string attribute against its allowed values (first = default).
Status checkChoice(const AttrMap &attrs, const char *name, std::initializer_list<const char *> allowed);

} // namespace sd
