// sd-qkv-attention: a self-attention whose q, k and v are the three parts of
// one fused projection (GPT-2's c_attn, Falcon's query_key_value, a q|k|v
// that sd-fuse-projections joined) reads them where that projection wrote
// them. In layout bshd the parts are token-major already, so the Split only
// copies each token's q, k and v heads apart, every
// forward; the backward's Concat copies their gradients together again for
// the projection's input gradient. QkvAttention takes the projection's
// output as [B, T, H + 2 Hkv, d] (a Reshape, which moves nothing), and its
// gradient writes [dq | dk | dv] per token as the projection's backward
// reads it: neither copy is left. Runs before autodiff, as sd-pack-swiglu.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"

namespace sd {
#define GEN_PASS_DEF_QKVATTENTION
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// The static shape of `v`, or none (empty) when it has no static shape.
ArrayRef<int64_t> staticShape(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() ? t.getShape() : ArrayRef<int64_t>();
}

// The Split result `v` is, read through Reshapes (views), when nothing else
// reads any of them; `index` is its place among the Split's results.
SplitOp splitPart(Value v, unsigned &index) {
  while (auto r = v.getDefiningOp<ReshapeOp>()) {
    if (!v.hasOneUse()) return {};
    v = r.getLhs();
  }
  auto part = dyn_cast<OpResult>(v);
  auto split = part ? dyn_cast<SplitOp>(part.getOwner()) : SplitOp();
  if (!split || !v.hasOneUse()) return {};
  index = part.getResultNumber();
  return split;
}

// The Split whose results 0, 1 and 2 are `a`'s q, k and v and that splits
// each token's values apart: the dims before its axis are the tokens (B T
// of them, in order: the parts' views to [B, T, h, d] are row-major), and
// each part holds its heads' h d values per token ([B, T, N] split along
// N, [B, T, H + 2 Hkv, d] by heads, an unsqueezed [B, 1, T, N], ...).
// Null when `a` is not such an attention.
SplitOp fusedProjectionOf(AttentionOp a) {
  if (a.getLayout() != "bshd" || !a.getLse().empty()) return {};
  ArrayRef<int64_t> q = staticShape(a.getQ()), k = staticShape(a.getKt()), v = staticShape(a.getV());
  if (q.size() != 4 || k.size() != 4 || k != v || q[0] != k[0] || q[1] != k[1] || q[3] != k[3]) return {};
  unsigned iq = 0, ik = 0, iv = 0;
  SplitOp split = splitPart(a.getQ(), iq);
  if (!split || splitPart(a.getKt(), ik) != split || splitPart(a.getV(), iv) != split || iq != 0 || ik != 1 ||
      iv != 2 || split.getOutputs().size() != 3)
    return {};
  ArrayRef<int64_t> x = staticShape(split.getInput());
  int64_t axis = split.getAxis().value_or(0);
  if (x.empty() || axis < -int64_t(x.size()) || axis >= int64_t(x.size())) return {};
  if (axis < 0) axis += int64_t(x.size());
  int64_t tokens = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) tokens *= x[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < x.size(); ++i) inner *= x[i];
  if (tokens != q[0] * q[1]) return {};
  const int64_t heads[3] = {q[2], k[2], k[2]};
  for (unsigned i = 0; i < 3; ++i) {
    ArrayRef<int64_t> part = staticShape(split.getOutputs()[i]);
    if (part.size() != x.size() || part[size_t(axis)] * inner != heads[i] * q[3]) return {};
  }
  return split;
}

struct QkvAttentionPass : sd::impl::QkvAttentionBase<QkvAttentionPass> {
  void runOnOperation() override {
    SmallVector<AttentionOp> attentions;
    getOperation().walk([&](AttentionOp a) { attentions.push_back(a); });
    for (AttentionOp a : attentions) {
      SplitOp split = fusedProjectionOf(a);
      if (!split) continue;
      ArrayRef<int64_t> q = staticShape(a.getQ()), k = staticShape(a.getKt());
      OpBuilder b(a);
      // The projection's output as [B, T, H + 2 Hkv, d]: a view (none when it has that shape).
      Value qkv = GradBuilder(b, a.getLoc()).reshape(split.getInput(), {q[0], q[1], q[2] + 2 * k[2], q[3]});
      SmallVector<NamedAttribute> attrs;
      for (NamedAttribute attr : a->getAttrs())
        if (attr.getName() != "layout") attrs.push_back(attr);
      attrs.push_back(b.getNamedAttr("kv_heads", b.getI64IntegerAttr(k[2])));
      auto fused = b.create<QkvAttentionOp>(a.getLoc(), TypeRange{a.getY().getType()},
                                            ValueRange{qkv, a.getMask(), a.getPositions()}, attrs);
      a.getY().replaceAllUsesWith(fused.getY());
      SmallVector<Operation *> dead{a};
      for (Value part : {a.getQ(), a.getKt(), a.getV()})
        for (auto r = part.getDefiningOp<ReshapeOp>(); r; r = r.getLhs().getDefiningOp<ReshapeOp>()) dead.push_back(r);
      dead.push_back(split);
      // Each op after its readers; then the shape constants nothing reads now.
      llvm::SetVector<Operation *> constants;
      for (Operation *op : dead) {
        for (Value operand : op->getOperands())
          if (Operation *c = operand.getDefiningOp<ConstantOp>()) constants.insert(c);
        op->erase();
      }
      for (Operation *c : constants)
        if (c->use_empty()) c->erase();
    }
  }
};

} // namespace
