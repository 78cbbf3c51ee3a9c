// Reverse-mode rules of Linear, MatMul, Gemm, Einsum and fused attention. Linear's weight gradient is
// one GEMM over the flattened batch, built only when the weight is trainable
// (a frozen weight costs no weight-gradient GEMM).
#include "GradBuilder.h"
#include "sd/ops/einsum.h"
#include <cmath>

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

// y[..., n] = x[..., k] op(W) with a 2-D W (oi: W is [n, k]; io: [k, n]):
// both gradients as single GEMMs over the flattened batch. Returns dy as
// [m, n]. Shared by Linear and by MatMul with a 2-D right operand.
Value flatLinearGrads(GradBuilder &g, Value x, Value w, bool oi, Value dy, ArrayRef<bool> need, Grads &dx) {
  ArrayRef<int64_t> xs = shapeOf(x), ws = shapeOf(w);
  int64_t k = xs.back(), n = oi ? ws[0] : ws[1], m = 1;
  for (size_t i = 0; i + 1 < xs.size(); ++i) m *= xs[i];
  Value dy2 = g.reshape(dy, {m, n});
  if (need[0]) {
    // oi: dy[M,N] x W[N,K]; io: dy[M,N] x W[K,N]^T.
    Value d = g.make<GemmOp>({dy2, w, g.none()}, {g.attr("transB", int64_t(!oi))});
    dx[0] = g.reshape(d, xs);
  }
  if (need[1]) {
    Value x2 = g.reshape(x, {m, k});
    // oi: dW[N,K] = dy^T x; io: dW[K,N] = x^T dy.
    dx[1] = oi ? g.make<GemmOp>({dy2, x2, g.none()}, {g.attr("transA", 1)})
               : g.make<GemmOp>({x2, dy2, g.none()}, {g.attr("transA", 1)});
  }
  return dy2;
}

LogicalResult linearVJP(LinearOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value dy2 = flatLinearGrads(g, op.getInput(), op.getWeight(), op.getLayout() == "oi", dy[0], need, dx);
  if (op->getNumOperands() > 2 && need[2]) dx[2] = g.reduceSum(dy2, {0}, false);
  return success();
}

// Batched C = A B with broadcast batch dims: dA = dC B^T, dB = A^T dC.
LogicalResult matmulVJP(MatMulOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value a = op.getLhs(), b = op.getRhs();
  if (shapeOf(a).size() < 2 || shapeOf(b).size() < 2)
    return op.emitError("MatMul with a rank-1 operand is not differentiable yet");
  // A 2-D B shared by every batch of A (an input projection x W): both
  // gradients are single GEMMs over the flattened batch, not batched products
  // of a few rows each and a sum of per-batch dB over the batch (on an LSTM
  // language model that sum read a [64, 128, 1024] intermediate).
  if (shapeOf(b).size() == 2 && shapeOf(a).size() > 2 && cast<RankedTensorType>(a.getType()).hasStaticShape() &&
      cast<RankedTensorType>(dy[0].getType()).hasStaticShape()) {
    flatLinearGrads(g, a, b, /*oi=*/false, dy[0], need, dx);
    return success();
  }
  if (need[0]) dx[0] = g.unbroadcast(g.make<MatMulOp>({dy[0], g.swapLastTwo(b)}), a.getType());
  if (need[1]) dx[1] = g.unbroadcast(g.make<MatMulOp>({g.swapLastTwo(a), dy[0]}), b.getType());
  return success();
}

// Y = alpha op(A) op(B) + beta C.
LogicalResult gemmVJP(GemmOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value a = op.getA(), b = op.getB();
  int64_t ta = op.getTransA().value_or(0), tb = op.getTransB().value_or(0);
  double alpha = op.getAlpha() ? double(op.getAlpha()->convertToFloat()) : 1.0;
  double beta = op.getBeta() ? double(op.getBeta()->convertToFloat()) : 1.0;
  Value d = dy[0];
  auto gemm = [&](Value l, Value r, int64_t tl, int64_t tr) {
    SmallVector<NamedAttribute> attrs = {g.attr("transA", tl), g.attr("transB", tr)};
    if (alpha != 1.0) attrs.push_back(g.builder().getNamedAttr("alpha", g.builder().getF32FloatAttr(float(alpha))));
    return g.make<GemmOp>({l, r, g.none()}, attrs);
  };
  if (need[0]) dx[0] = ta ? gemm(b, d, tb, 1) : gemm(d, b, 0, !tb);
  if (need[1]) dx[1] = tb ? gemm(d, a, 1, ta) : gemm(a, d, !ta, 0);
  if (op->getNumOperands() > 2 && need[2] && !isa<NoneType>(op.getC().getType()))
    dx[2] = g.unbroadcast(beta == 1.0 ? d : g.scale(d, beta), op.getC().getType());
  return success();
}

// Keys or values broadcast over q's batch dims (shared across heads): the
// same math from unfused ops, whose gradients reduce over the broadcast.
LogicalResult attentionVJPUnfused(AttentionOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                                  Grads &dx) {
  Value q = op.getQ(), kt = op.getKt(), v = op.getV(), mask = op.getMask();
  if (!isa<NoneType>(op.getPositions().getType()))
    return op.emitError("attention over packed sequences needs queries, keys and values with the same batch dims");
  Type et = elementTypeOf(q);
  double scale = op.getScale() ? double(op.getScale()->convertToFloat()) : 1.0;
  Value s = g.scale(g.make<MatMulOp>({q, kt}), scale);
  if (!isa<NoneType>(mask.getType())) {
    double fill = op.getMaskValue() ? double(op.getMaskValue()->convertToFloat()) : -INFINITY;
    s = g.make<WhereOp>({mask, g.scalar(et, fill), s});
  }
  Value p = g.make<SoftmaxOp>({s}, {g.attr("axis", -1)});
  if (op.getZeroMaskedRows().value_or(0)) // rows with every key masked: 0, not NaN
    p = g.make<WhereOp>({g.make<IsNaNOp>({p}), g.scalar(et, 0.0), p});
  if (need[2]) dx[2] = g.unbroadcast(g.make<MatMulOp>({g.swapLastTwo(p), dy[0]}), v.getType());
  Value ds = g.make<SoftmaxGradOp>({g.make<MatMulOp>({dy[0], g.swapLastTwo(v)}), p}, {g.attr("axis", -1)});
  if (!isa<NoneType>(mask.getType())) ds = g.make<WhereOp>({mask, g.scalar(et, 0.0), ds});
  if (need[0]) dx[0] = g.unbroadcast(g.scale(g.make<MatMulOp>({ds, g.swapLastTwo(kt)}), scale), q.getType());
  if (need[1]) dx[1] = g.unbroadcast(g.scale(g.make<MatMulOp>({g.swapLastTwo(q), ds}), scale), kt.getType());
  return success();
}

// One fused kernel for all three gradients (the mask gets none).
LogicalResult attentionVJP(AttentionOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  ArrayRef<int64_t> qs = shapeOf(op.getQ()), ks = shapeOf(op.getKt()), vs = shapeOf(op.getV());
  auto batch = [](ArrayRef<int64_t> s) { return s.drop_back(2); };
  const bool tokenMajor = op.getLayout() == "bshd"; // shared key/value heads are the kernel's to sum
  if (!tokenMajor &&
      (ks.size() != qs.size() || vs.size() != qs.size() || batch(ks) != batch(qs) || batch(vs) != batch(qs)))
    return attentionVJPUnfused(op, g, dy, need, dx);
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"scale", "mask_value", "zero_masked_rows", "layout"});
  Operation *grad = g.op<AttentionGradOp>(
      {dy[0], op.getQ(), op.getKt(), op.getV(), op.getMask(), op.getPositions(), g.none(), g.none()}, attrs, 3);
  if (!grad) return failure();
  for (unsigned i = 0; i < 3; ++i)
    if (need[i]) dx[i] = grad->getResult(i);
  return success();
}

// Its gradient shaped like qkv: [dq | dk | dv] per token.
LogicalResult qkvAttentionVJP(QkvAttentionOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                              Grads &dx) {
  if (!need[0]) return success();
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"scale", "mask_value", "zero_masked_rows", "kv_heads"});
  Operation *grad = g.op<QkvAttentionGradOp>(
      {dy[0], op.getQkv(), op.getMask(), op.getPositions(), g.none(), g.none()}, attrs, 1);
  if (!grad) return failure();
  dx[0] = grad->getResult(0);
  return success();
}

// Einsum: operand i's gradient is the einsum of dy with the other operands,
// producing operand i's labels. Labels only operand i has (summed in the
// forward) are broadcast back, and so are its size-1 ellipsis dims that
// broadcast against bigger ones (summed by the gradient einsum). A label
// repeated within one operand (a diagonal, "ii->i", a trace) gets the
// gradient at its first place, broadcast along the others and masked to
// where all its places agree.
// 1 where every label repeated in `term` has one index at all its places,
// 0 elsewhere; shape: the repeated labels' sizes, 1 at the other places.
Value diagonalMask(GradBuilder &g, const std::string &term, ArrayRef<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  SmallVector<int64_t> mask(static_cast<size_t>(count)), index(shape.size());
  for (int64_t e = 0; e < count; ++e) {
    for (int64_t k = int64_t(shape.size()) - 1, rest = e; k >= 0; --k) {
      index[size_t(k)] = rest % shape[size_t(k)];
      rest /= shape[size_t(k)];
    }
    bool onDiagonal = true;
    for (size_t k = 0; k < term.size(); ++k)
      onDiagonal = onDiagonal && (shape[k] == 1 || index[k] == index[term.find(term[k])]);
    mask[size_t(e)] = onDiagonal;
  }
  return g.ints(shape, mask);
}

LogicalResult einsumVJP(EinsumOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  std::vector<Dims> dims;
  for (Value v : op.getInputs()) dims.emplace_back(shapeOf(v).begin(), shapeOf(v).end());
  EinsumSpec spec;
  if (!parseEinsum(op.getEquation().str(), dims, spec).isOk()) return op.emitError("Einsum: bad equation");
  // One letter per label, and a fresh one for each broadcast size-1 dim.
  int next = spec.numLabels;
  auto letter = [](int id) { return char(id < 26 ? 'a' + id : 'A' + id - 26); };
  std::vector<std::string> terms;
  for (size_t t = 0; t < dims.size(); ++t) {
    std::string term;
    for (size_t k = 0; k < dims[t].size(); ++k) {
      int l = spec.inputLabels[t][k];
      term += dims[t][k] == 1 && spec.labelSize[size_t(l)] != 1 ? letter(next++) : letter(l);
    }
    terms.push_back(term);
  }
  if (next > 52) return op.emitError("Einsum: too many labels to differentiate");
  std::string out;
  for (int l : spec.outputLabels) out += letter(l);
  for (size_t i = 0; i < terms.size(); ++i) {
    if (!need[i]) continue;
    std::string others = out, kept;
    SmallVector<Value> operands = {dy[0]};
    for (size_t j = 0; j < terms.size(); ++j)
      if (j != i) {
        others += "," + terms[j];
        operands.push_back(op.getInputs()[j]);
      }
    SmallVector<int64_t> keptShape(dims[i].begin(), dims[i].end()), maskShape(dims[i].size(), 1);
    bool diagonal = false;
    for (size_t k = 0; k < terms[i].size(); ++k) {
      char c = terms[i][k];
      bool repeated = terms[i].find(c) != k || terms[i].find(c, k + 1) != std::string::npos;
      if (repeated) maskShape[k] = dims[i][k];
      diagonal = diagonal || terms[i].find(c) != k;
      if (terms[i].find(c) == k && others.find(c) != std::string::npos) kept += c;
      else keptShape[k] = 1;
    }
    Value grad = g.make<EinsumOp>(operands, {g.builder().getNamedAttr(
                                                "equation", g.builder().getStringAttr(others + "->" + kept))});
    grad = g.reshape(grad, keptShape);
    Type x = op.getInputs()[i].getType();
    dx[i] = grad && grad.getType() != x ? g.make<ExpandOp>({grad, g.ints(dims[i])}) : grad;
    if (diagonal && dx[i]) dx[i] = g.mul(dx[i], g.castTo(diagonalMask(g, terms[i], maskShape), elementTypeOf(dx[i])));
  }
  return success();
}

} // namespace

void attachLinalgVJPs(MLIRContext *ctx) {
  attachVJP<LinearOp, linearVJP>(ctx);
  attachVJP<MatMulOp, matmulVJP>(ctx);
  attachVJP<GemmOp, gemmVJP>(ctx);
  attachVJP<EinsumOp, einsumVJP>(ctx);
  attachVJP<AttentionOp, attentionVJP>(ctx);
  attachVJP<QkvAttentionOp, qkvAttentionVJP>(ctx);
}

} // namespace sd::ir
