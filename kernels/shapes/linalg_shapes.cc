// Shape rules for MatMul, Gemm, Linear, Det and fused attention.
#include "shape_util.h"

namespace sd {

Status matmulDims(const TensorInfo &a, const TensorInfo &b, TensorInfo &out) {
  out.dtype = a.dtype;
  if (!a.rankKnown || !b.rankKnown) {
    out.rankKnown = false;
    return Status::ok();
  }
  SD_CHECK_ARG(a.rank() >= 1 && b.rank() >= 1, "MatMul operands must have rank >= 1");
  TensorInfo a2 = a, b2 = b;
  if (a.rank() == 1) a2.dims.insert(a2.dims.begin(), 1);
  if (b.rank() == 1) b2.dims.push_back(1);
  int64_t k1 = a2.dims.back(), k2 = b2.dims[b2.dims.size() - 2];
  if (k1 >= 0 && k2 >= 0 && k1 != k2)
    return sdError("MatMul inner dimensions differ: ", formatDims(a.dims), " x ",
                   formatDims(b.dims));
  TensorInfo ba, bb;
  ba.dims.assign(a2.dims.begin(), a2.dims.end() - 2);
  bb.dims.assign(b2.dims.begin(), b2.dims.end() - 2);
  SD_RETURN_IF_ERROR(broadcastDims({&ba, &bb}, out));
  out.dtype = a.dtype;
  if (a.rank() != 1) out.dims.push_back(a2.dims[a2.dims.size() - 2]);
  if (b.rank() != 1) out.dims.push_back(b2.dims.back());
  return Status::ok();
}

static Status matmulShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs.size() >= 2, "MatMul takes 2 operands");
  SD_CHECK_ARG(c.inputs[0].dtype == c.inputs[1].dtype, "MatMul operand types differ");
  TensorInfo out;
  SD_RETURN_IF_ERROR(matmulDims(c.inputs[0], c.inputs[1], out));
  c.outputs = {out};
  return Status::ok();
}

static Status gemmShape(ShapeContext &c) {
  const TensorInfo &a = c.inputs[0], &b = c.inputs[1];
  SD_CHECK_ARG(a.rank() == 2 && b.rank() == 2, "Gemm operands must be 2-D");
  bool ta = c.attrs.getInt("transA", 0), tb = c.attrs.getInt("transB", 0);
  int64_t m = ta ? a.dims[1] : a.dims[0], k1 = ta ? a.dims[0] : a.dims[1];
  int64_t k2 = tb ? b.dims[1] : b.dims[0], n = tb ? b.dims[0] : b.dims[1];
  if (k1 >= 0 && k2 >= 0 && k1 != k2)
    return sdError("Gemm inner dimensions differ: ", k1, " vs ", k2);
  TensorInfo out;
  out.dtype = a.dtype;
  out.dims = {m, n};
  if (c.hasInput(2)) {
    TensorInfo bc;
    SD_RETURN_IF_ERROR(broadcastDims({&out, &c.inputs[2]}, bc));
    if (bc.dims != out.dims && out.isStatic())
      return sdError("Gemm bias ", formatDims(c.inputs[2].dims), " does not broadcast to ",
                     formatDims(out.dims));
  }
  c.outputs = {out};
  return Status::ok();
}

// Linear(x, w, bias): x[..., K] times w ([N, K] with layout "oi", [K, N] with "io").
static Status linearShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &w = c.inputs[1];
  SD_CHECK_ARG(w.rank() == 2, "linear weight must be 2-D");
  SD_CHECK_ARG(x.rank() >= 1, "linear input must have rank >= 1");
  bool oi = c.attrs.getString("layout", "io") == "oi";
  int64_t k = oi ? w.dims[1] : w.dims[0], n = oi ? w.dims[0] : w.dims[1];
  int64_t xk = x.dims.back();
  if (xk >= 0 && k >= 0 && xk != k)
    return sdError("linear input feature size ", xk, " does not match weight ", formatDims(w.dims));
  if (c.hasInput(2)) {
    const TensorInfo &b = c.inputs[2];
    SD_CHECK_ARG(b.rank() == 1 && (b.dims[0] == n || b.dims[0] < 0 || n < 0),
                 "linear bias must be [", n, "], got ", formatDims(b.dims));
  }
  TensorInfo out = x;
  out.dims.back() = n;
  c.outputs = {out};
  return Status::ok();
}

// An operand summed into a product (LinearAdd's and LinearGelu's addend,
// GemmDGelu's c) has the product's shape and type.
static Status checkAddend(const ShapeContext &c, size_t index, const TensorInfo &product, const char *op,
                          const char *name) {
  const TensorInfo &addend = c.inputs[index];
  SD_CHECK_ARG(addend.dtype == product.dtype, op, ": ", name, " has element type ", dtypeName(addend.dtype),
               ", the product ", dtypeName(product.dtype));
  if (addend.rankKnown && product.isStatic() && addend.isStatic() && addend.dims != product.dims)
    return sdError(op, ": ", name, " ", formatDims(addend.dims), " does not match the product ",
                   formatDims(product.dims));
  return Status::ok();
}

// LinearAdd(x, w, bias, addend) -> Linear + addend.
static Status linearAddShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(linearShape(c));
  SD_CHECK_ARG(c.hasInput(3), "LinearAdd needs an addend");
  return checkAddend(c, 3, c.outputs[0], "LinearAdd", "addend");
}

// LinearGelu(x, w, bias, addend) -> gelu(Linear [+ addend]), and its input.
static Status linearGeluShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(linearShape(c));
  if (c.hasInput(3)) SD_RETURN_IF_ERROR(checkAddend(c, 3, c.outputs[0], "LinearGelu", "addend"));
  c.outputs.push_back(c.outputs[0]);
  return Status::ok();
}

// GemmDGelu(a, b, pre, c) -> GeluGrad(Gemm(a, b) [+ c], pre) [m, n], its row sums [n].
static Status gemmDGeluShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(gemmShape(c)); // the product; a third operand is no bias here
  TensorInfo grad = c.outputs[0];
  SD_RETURN_IF_ERROR(checkAddend(c, 2, grad, "GemmDGelu", "pre"));
  if (c.hasInput(3)) SD_RETURN_IF_ERROR(checkAddend(c, 3, grad, "GemmDGelu", "c"));
  TensorInfo bias;
  bias.dtype = grad.dtype;
  bias.dims = {grad.dims[1]};
  c.outputs = {grad, bias};
  return Status::ok();
}

// Attention(q [..., T, d], kt [..., d, S], v [..., S, dv], mask bool
// broadcastable to [..., T, S], positions i64 [B, T]) -> [..., T, dv]:
// softmax(q kt * scale, masked) v; or, in layout bshd, token-major operands
// (q [B, T, H, d], k [B, S, Hkv, d], v [B, S, Hkv, dv]) -> [B, T, H, dv];
// and, when asked for, the f32 log-sum-exp of each scores row ([..., T]).
static Status attentionResults(ShapeContext &c, const TensorInfo &q, const TensorInfo &kt, const TensorInfo &v,
                               bool tokenMajor, size_t maskAt) {
  TensorInfo scores{q.dtype, {}}, out{q.dtype, {}};
  if (tokenMajor) {
    SD_RETURN_IF_ERROR(tokenMajorAttentionDims(q, kt, v, scores.dims, out.dims));
  } else {
    SD_RETURN_IF_ERROR(matmulDims(q, kt, scores));
    SD_RETURN_IF_ERROR(matmulDims(scores, v, out));
  }
  if (c.hasInput(maskAt)) {
    const TensorInfo &mask = c.inputs[maskAt];
    SD_CHECK_ARG(mask.dtype == DType::Bool, "Attention mask must be bool");
    TensorInfo joined;
    SD_RETURN_IF_ERROR(broadcastDims({&scores, &mask}, joined));
    if (scores.isStatic() && mask.isStatic() && joined.dims != scores.dims)
      return sdError("Attention mask ", formatDims(mask.dims), " does not broadcast to ", formatDims(scores.dims));
  }
  if (c.hasInput(maskAt + 1)) SD_RETURN_IF_ERROR(checkAttentionPositions(q, kt, c.inputs[maskAt + 1], tokenMajor));
  // The optional row statistics: f32, one per query row of the scores.
  TensorInfo lse{DType::F32, {}, out.rankKnown};
  if (out.rankKnown && !out.dims.empty()) lse.dims = attentionRowDims(out.dims, tokenMajor);
  c.outputs = {out, lse};
  return Status::ok();
}

static Status attentionShape(ShapeContext &c) {
  const TensorInfo &q = c.inputs[0], &kt = c.inputs[1], &v = c.inputs[2];
  SD_CHECK_ARG((q.dtype == DType::F32 || q.dtype == DType::BF16 || q.dtype == DType::F16) && kt.dtype == q.dtype &&
                   v.dtype == q.dtype,
               "Attention needs q, kt, v of one float type (f32, bf16, f16)");
  SD_CHECK_ARG(q.rank() >= 2 && kt.rank() >= 2 && v.rank() >= 2, "Attention operands must have rank >= 2");
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "layout", {"bhtd", "bshd"}));
  return attentionResults(c, q, kt, v, c.attrs.getString("layout", "bhtd") == "bshd", 3);
}

// QkvAttention(qkv [B, T, H + 2 Hkv, d], mask, positions) {kv_heads = Hkv}:
// Attention in layout bshd on the q, k and v heads qkv holds per token.
static Status qkvAttentionShape(ShapeContext &c) {
  const TensorInfo &qkv = c.inputs[0];
  SD_CHECK_ARG(qkv.dtype == DType::F32 || qkv.dtype == DType::BF16 || qkv.dtype == DType::F16,
               "QkvAttention needs a float qkv (f32, bf16, f16)");
  TensorInfo q, k, v;
  SD_RETURN_IF_ERROR(qkvAttentionParts(qkv, c.attrs, q, k, v));
  return attentionResults(c, q, k, v, true, 1);
}

// Det: [..., M, M] -> [...].
static Status detShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype), "Det takes a float tensor");
  SD_CHECK_ARG(x.rank() >= 2, "Det takes [..., M, M], got rank ", x.rank());
  int64_t a = x.dims[size_t(x.rank() - 2)], b = x.dims.back();
  SD_CHECK_ARG(a < 0 || b < 0 || a == b, "Det takes square matrices, got ", formatDims(x.dims));
  c.outputs = {TensorInfo{x.dtype, Dims(x.dims.begin(), x.dims.end() - 2)}};
  return Status::ok();
}

void registerLinalgShapes() {
  registerShapeRule("Det", detShape);
  registerShapeRule("MatMul", matmulShape);
  registerShapeRule("Gemm", gemmShape);
  registerShapeRule("Linear", linearShape);
  registerShapeRule("LinearAdd", linearAddShape);
  registerShapeRule("LinearGelu", linearGeluShape);
  registerShapeRule("GemmDGelu", gemmDGeluShape);
  registerShapeRule("Attention", attentionShape);
  registerShapeRule("QkvAttention", qkvAttentionShape);
}

} // namespace sd
