// Shape rule of ONNX LinearAttention (opset 27): query/key [B, T, H_q*d_k] /
// [B, T, H_kv*d_k], value [B, T, H_kv*d_v]; optional past_state
// [B, H_kv, d_k, d_v], decay [B, T, H_kv or H_kv*d_k], beta [B, T, H_kv or 1]
// as the update rule requires. Gives output [B, T, H_q*d_v] and present_state.
#include "shape_util.h"

namespace sd {

static bool fits(int64_t dim, int64_t want) { return dim < 0 || dim == want; }

static Status linearAttentionShape(ShapeContext &c) {
  const TensorInfo &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "update_rule", {"gated_delta", "linear", "gated", "delta"}));
  std::string rule = c.attrs.getString("update_rule", "gated_delta");
  bool gating = rule == "gated" || rule == "gated_delta", delta = rule == "delta" || rule == "gated_delta";
  int64_t hq = c.attrs.getInt("q_num_heads", 0), hkv = c.attrs.getInt("kv_num_heads", 0);
  SD_CHECK_ARG(hq > 0 && hkv > 0 && hq % hkv == 0, "LinearAttention needs q_num_heads a positive multiple of "
               "kv_num_heads, got ", hq, " and ", hkv);
  SD_CHECK_ARG(q.rank() == 3 && k.rank() == 3 && v.rank() == 3, "LinearAttention takes 3-D query, key and value");
  for (const TensorInfo *t : {&q, &k, &v})
    for (int64_t d : t->dims) SD_CHECK_ARG(d >= 0, "LinearAttention needs static shapes");
  SD_CHECK_ARG(dtypeIsFloat(q.dtype) && k.dtype == q.dtype && v.dtype == q.dtype,
               "LinearAttention's query, key and value must share one float type");
  SD_CHECK_ARG(q.dims[2] % hq == 0 && v.dims[2] % hkv == 0, "hidden sizes must divide by the head counts");
  int64_t b = q.dims[0], t = q.dims[1], dk = q.dims[2] / hq, dv = v.dims[2] / hkv;
  SD_CHECK_ARG(k.dims[0] == b && v.dims[0] == b && k.dims[1] == t && v.dims[1] == t && k.dims[2] == hkv * dk,
               "key and value must be [", b, ", ", t, ", kv_num_heads * d]");
  bool hasPast = c.hasInput(3), hasDecay = c.hasInput(4), hasBeta = c.hasInput(5);
  SD_CHECK_ARG(hasDecay == gating, "update_rule '", rule, hasDecay ? "' forbids" : "' requires", " decay");
  SD_CHECK_ARG(hasBeta == delta, "update_rule '", rule, hasBeta ? "' forbids" : "' requires", " beta");
  if (hasPast) {
    const TensorInfo &p = c.inputs[3];
    SD_CHECK_ARG(p.rank() == 4 && fits(p.dims[0], b) && fits(p.dims[1], hkv) && fits(p.dims[2], dk) &&
                 fits(p.dims[3], dv), "past_state must be [", b, ", ", hkv, ", ", dk, ", ", dv, "], got ",
                 formatDims(p.dims));
    SD_CHECK_ARG(p.dtype == q.dtype, "past_state must have the query's type (", dtypeName(q.dtype), "), got ",
                 dtypeName(p.dtype));
  }
  if (hasDecay) {
    const TensorInfo &d = c.inputs[4];
    SD_CHECK_ARG(d.rank() == 3 && fits(d.dims[0], b) && fits(d.dims[1], t) && (d.dims[2] == hkv || d.dims[2] == hkv * dk),
                 "decay must be [B, T, kv_num_heads] or [B, T, kv_num_heads * d_k], got ", formatDims(d.dims));
    SD_CHECK_ARG(d.dtype == q.dtype, "decay must have the query's type");
  }
  if (hasBeta) {
    const TensorInfo &be = c.inputs[5];
    SD_CHECK_ARG(be.rank() == 3 && fits(be.dims[0], b) && fits(be.dims[1], t) && (be.dims[2] == hkv || be.dims[2] == 1),
                 "beta must be [B, T, kv_num_heads] or [B, T, 1], got ", formatDims(be.dims));
    SD_CHECK_ARG(be.dtype == q.dtype, "beta must have the query's type");
  }
  c.outputs = {TensorInfo{q.dtype, {b, t, hq * dv}}, TensorInfo{q.dtype, {b, hkv, dk, dv}}};
  return Status::ok();
}

void registerLinearAttentionShapes() { registerShapeRule("LinearAttention", linearAttentionShape); }

} // namespace sd
