// sd-fuse-rotary: recognizes the rotary position embedding as Hugging Face's
// apply_rotary_pos_emb exports it, q * cos + rotate_half(q) * sin with
// rotate_half(q) = Concat(-q[..., D/2:], q[..., :D/2]), or with the
// interleaved pairs' rotation stack([-q[..., 1::2], q[..., ::2]], -1).flatten(-2)
// (GPT-J, Cohere), and replaces it with one sd.rotary. The rotation then runs as one kernel each way (its backward
// is the transposed rotation), and sd-pack-sequences can hand it per-token
// positions. Runs once shapes are static: cos and sin only take their final
// form ([.., S, D], often constants) after specialization.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_FUSEROTARY
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// `v` = data[..., start:end:step] along the last axis, a positive step (start
// and end clamped to the dim); returns data, or null.
Value lastAxisSlice(Value v, int64_t &start, int64_t &end, int64_t &step) {
  auto s = v.getDefiningOp<SliceOp>();
  if (!s) return {};
  auto type = dyn_cast<RankedTensorType>(s.getData().getType());
  if (!type || !type.hasStaticShape()) return {};
  int64_t rank = type.getRank(), dim = type.getDimSize(rank - 1);
  SmallVector<int64_t> starts, ends, axes, steps;
  if (!constantInts(s.getStarts(), starts) || !constantInts(s.getEnds(), ends) || starts.size() != 1 ||
      ends.size() != 1)
    return {};
  if (!isa<NoneType>(s.getAxes().getType()) &&
      (!constantInts(s.getAxes(), axes) || axes.size() != 1 || (axes[0] != -1 && axes[0] != rank - 1)))
    return {};
  if (isa<NoneType>(s.getAxes().getType()) && rank != 1) return {};
  if (!isa<NoneType>(s.getSteps().getType()) && (!constantInts(s.getSteps(), steps) || steps.size() != 1 || steps[0] < 1))
    return {};
  step = steps.empty() ? 1 : steps[0];
  auto clamp = [&](int64_t i) { return std::clamp(i < 0 ? i + dim : i, int64_t(0), dim); };
  start = clamp(starts[0]);
  end = clamp(ends[0]);
  return s.getData();
}

// The x of rotate_half(x) = Concat(-x[..., h:], x[..., :h]) over the last
// axis, h = D/2; null when `r` is not that.
Value rotateHalfOf(Value r) {
  auto cat = r.getDefiningOp<ConcatOp>();
  auto type = dyn_cast<RankedTensorType>(r.getType());
  if (!cat || !type || cat.getInputs().size() != 2) return {};
  int64_t axis = int64_t(cat.getAxis()), rank = type.getRank();
  if (axis != -1 && axis != rank - 1) return {};
  auto neg = cat.getInputs()[0].getDefiningOp<NegOp>();
  if (!neg) return {};
  int64_t hiStart, hiEnd, hiStep, loStart, loEnd, loStep;
  Value hi = lastAxisSlice(neg.getInput(), hiStart, hiEnd, hiStep),
        lo = lastAxisSlice(cat.getInputs()[1], loStart, loEnd, loStep);
  if (!hi || hi != lo || hi.getType() != r.getType() || hiStep != 1 || loStep != 1) return {};
  int64_t d = type.getDimSize(rank - 1);
  if (d % 2 || hiStart != d / 2 || hiEnd != d || loStart != 0 || loEnd != d / 2) return {};
  return hi;
}

// The x of the interleaved rotation (GPT-J, Cohere) written out:
// Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1), axis=-1))
// to x's shape, i.e. torch.stack([-x2, x1], -1).flatten(-2); null when `r` is not that.
Value rotateInterleavedOf(Value r) {
  auto reshape = r.getDefiningOp<ReshapeOp>();
  auto type = dyn_cast<RankedTensorType>(r.getType());
  if (!reshape || !type || !type.hasStaticShape()) return {};
  auto cat = reshape.getLhs().getDefiningOp<ConcatOp>();
  if (!cat || cat.getInputs().size() != 2) return {};
  auto catType = cast<RankedTensorType>(cat.getResult().getType());
  int64_t axis = int64_t(cat.getAxis()), rank = catType.getRank();
  if ((axis != -1 && axis != rank - 1) || rank != type.getRank() + 1 || catType.getDimSize(rank - 1) != 2) return {};
  Value halves[2];
  for (int i = 0; i < 2; ++i) { // each a [..., D/2, 1] Unsqueeze of a strided slice
    auto u = cat.getInputs()[i].getDefiningOp<UnsqueezeOp>();
    if (!u || cast<RankedTensorType>(u.getResult().getType()).getDimSize(rank - 1) != 1 ||
        cast<RankedTensorType>(u.getLhs().getType()).getRank() != rank - 1)
      return {};
    halves[i] = u.getLhs();
  }
  auto neg = halves[0].getDefiningOp<NegOp>();
  if (!neg) return {};
  int64_t oddStart, oddEnd, oddStep, evenStart, evenEnd, evenStep;
  Value odd = lastAxisSlice(neg.getInput(), oddStart, oddEnd, oddStep),
        even = lastAxisSlice(halves[1], evenStart, evenEnd, evenStep);
  if (!odd || odd != even || odd.getType() != r.getType()) return {};
  int64_t d = type.getDimSize(type.getRank() - 1);
  if (d % 2 || oddStep != 2 || evenStep != 2 || oddStart != 1 || evenStart != 0 || oddEnd < d || evenEnd < d - 1)
    return {};
  return odd;
}

struct FuseRotaryPass : sd::impl::FuseRotaryBase<FuseRotaryPass> {
  void runOnOperation() override {
    SmallVector<AddOp> roots;
    getOperation().walk([&](AddOp a) { roots.push_back(a); });
    for (AddOp a : roots) tryFuse(a);
  }

  // add(x * cos, rotate_half(x) * sin), in any operand order.
  void tryFuse(AddOp add) {
    for (int first = 0; first < 2; ++first) {
      auto direct = add->getOperand(unsigned(first)).getDefiningOp<MulOp>();
      auto rotated = add->getOperand(unsigned(1 - first)).getDefiningOp<MulOp>();
      if (!direct || !rotated) continue;
      for (int r = 0; r < 2; ++r) {
        bool interleaved = false;
        Value x = rotateHalfOf(rotated->getOperand(unsigned(r)));
        if (!x) x = rotateInterleavedOf(rotated->getOperand(unsigned(r))), interleaved = true;
        Value sin = rotated->getOperand(unsigned(1 - r));
        Value cos = x ? sd::otherOperand(direct, x) : Value();
        if (cos && replace(add, x, cos, sin, interleaved)) return;
      }
    }
  }

  // cos/sin broadcast over x [B, ..., S, D] along every axis but the batch,
  // S and D: as the [Bc, S, D] operands of sd.rotary.
  static bool angleShape(Value angle, ArrayRef<int64_t> x, SmallVectorImpl<int64_t> &out) {
    auto t = dyn_cast<RankedTensorType>(angle.getType());
    if (!t || !t.hasStaticShape() || t.getRank() > int64_t(x.size()) || t.getRank() < 2) return false;
    int64_t rank = int64_t(x.size()), offset = rank - t.getRank();
    auto dim = [&](int64_t i) { return i < offset ? int64_t(1) : t.getDimSize(i - offset); };
    if (dim(rank - 1) != x[rank - 1] || dim(rank - 2) != x[rank - 2]) return false;
    for (int64_t i = 1; i < rank - 2; ++i)
      if (dim(i) != 1) return false;
    if (dim(0) != 1 && dim(0) != x[0]) return false;
    out.assign({dim(0), x[rank - 2], x[rank - 1]});
    return true;
  }

  // v reshaped to `shape`; a dense constant (the usual cos/sin table) is
  // reshaped in place, so later passes still see its values.
  static Value asShape(GradBuilder &g, Value v, ArrayRef<int64_t> shape) {
    auto type = cast<RankedTensorType>(v.getType());
    if (type.getShape() == shape) return v;
    if (auto c = v.getDefiningOp<ConstantOp>())
      if (auto dense = dyn_cast<DenseElementsAttr>(c.getValue()))
{
        auto reshaped = type.clone(shape);
        return g.builder().create<ConstantOp>(c.getLoc(), reshaped, dense.reshape(reshaped)).getResult();
      }
    return g.reshape(v, shape);
  }

  // With full-width cos/sin ([.., S, D], one angle per feature) the kernel
  // computes exactly the graph's x * cos + rotated(x) * sin, whatever the
  // angles: y[p] = x[p] c[p] - x[q] s[p], y[q] = x[q] c[q] + x[p] s[q] for
  // each rotated pair (p, q).
  bool replace(AddOp add, Value x, Value cos, Value sin, bool interleaved) {
    auto xt = dyn_cast<RankedTensorType>(x.getType());
    if (!xt || !xt.hasStaticShape() || xt.getRank() < 3 || !isa<FloatType>(xt.getElementType()) ||
        add.getResult().getType() != xt || cos.getType() != sin.getType() ||
        cast<RankedTensorType>(cos.getType()).getElementType() != xt.getElementType())
      return false;
    SmallVector<int64_t> shape;
    if (!angleShape(cos, xt.getShape(), shape)) return false;
    OpBuilder b(add);
    GradBuilder g(b, add.getLoc());
    Value c = asShape(g, cos, shape), s = asShape(g, sin, shape);
    SmallVector<NamedAttribute> attrs;
    if (interleaved) attrs.push_back(b.getNamedAttr("interleaved", b.getI64IntegerAttr(1)));
    Value y = g.make<RotaryOp>({x, c, s, g.none()}, attrs);
    if (!y || g.failed()) return false;
    add.getResult().replaceAllUsesWith(y);
    // The decomposed ops are now dead; sd-propagate-shapes removes them.
    return true;
  }
};

} // namespace
