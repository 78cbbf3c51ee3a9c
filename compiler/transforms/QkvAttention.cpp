// sd-qkv-attention: a self-attention whose q, k and v are the three parts of
// one fused projection (GPT-2's and StarCoder's c_attn, Phi-3's qkv_proj, a
// q|k|v that sd-fuse-projections joined) reads them where that projection
// wrote them. In layout bshd the parts are token-major already, so the
// Split only copies each token's q, k and v heads apart (and a rotary
// embedding of q and k reads and writes them apart again) every forward,
// and the backward's Concat copies their gradients together again for the
// projection's input gradient. QkvAttention takes the projection's output
// as [B, T, H + 2 Hkv, d] (a Reshape, which moves nothing), and its
// gradient writes [dq | dk | dv] per token as the projection's backward
// reads it: neither copy is left. Rotated q and k become one Rotary over
// the whole qkv that rotates its q and k heads and passes the v heads
// through (rotated_heads). Runs before autodiff, as sd-pack-swiglu.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"
#include <algorithm>

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

// A run of a fused projection's output x along one of its axes: [begin,
// end), cut out by `op` (a Split's result, or a Slice of step 1).
struct Part {
  Value x;
  Operation *op = nullptr;
  int64_t axis = 0, begin = 0, end = 0;
  SmallVector<Operation *> views; // what the attention reads it through, outermost first
};

// A Slice that keeps all of its input, in order (Phi-3's rotary on "the
// first head_dim features" of each head): its input.
Value wholeSliceInput(Operation *op) {
  auto slice = dyn_cast_or_null<SliceOp>(op);
  SmallVector<int64_t> steps;
  if (!slice || slice.getResult().getType() != slice.getData().getType() || !staticShape(slice.getData()).size())
    return {};
  if (!isa<NoneType>(slice.getSteps().getType()) &&
      (!constantInts(slice.getSteps(), steps) || llvm::any_of(steps, [](int64_t s) { return s != 1; })))
    return {};
  return slice.getData();
}

// The part `v` is, read through views (Reshapes, whole Slices), when nothing
// else reads any of them.
bool partOf(Value v, Part &p) {
  SmallVector<Operation *> views;
  while (true) {
    Operation *op = v.getDefiningOp();
    Value in = isa_and_nonnull<ReshapeOp>(op) ? op->getOperand(0) : wholeSliceInput(op);
    if (!in) break;
    if (!v.hasOneUse()) return false;
    views.push_back(op);
    v = in;
  }
  if (!v.hasOneUse()) return false;
  auto res = dyn_cast<OpResult>(v);
  if (!res) return false;
  auto axisOf = [](int64_t axis, ArrayRef<int64_t> x) {
    return axis < -int64_t(x.size()) || axis >= int64_t(x.size()) ? -1 : axis < 0 ? axis + int64_t(x.size()) : axis;
  };
  if (auto split = dyn_cast<SplitOp>(res.getOwner())) {
    if (split.getOutputs().size() != 3) return false; // q, k and v, all three read by the attention
    ArrayRef<int64_t> x = staticShape(split.getInput());
    p = {split.getInput(), split, axisOf(split.getAxis().value_or(0), x), 0, 0};
    if (x.empty() || p.axis < 0) return false;
    for (unsigned i = 0; i <= res.getResultNumber(); ++i) {
      ArrayRef<int64_t> out = staticShape(split.getOutputs()[i]);
      if (out.size() != x.size()) return false;
      p.begin = p.end, p.end += out[size_t(p.axis)];
    }
    p.views = views;
    return true;
  }
  auto slice = dyn_cast<SliceOp>(res.getOwner());
  SmallVector<int64_t> starts, ends, axes, steps;
  ArrayRef<int64_t> x = slice ? staticShape(slice.getData()) : ArrayRef<int64_t>();
  if (x.empty() || !constantInts(slice.getStarts(), starts) || !constantInts(slice.getEnds(), ends) ||
      starts.size() != 1 || ends.size() != 1)
    return false;
  if (isa<NoneType>(slice.getAxes().getType())) axes = {0};
  else if (!constantInts(slice.getAxes(), axes)) return false;
  if (isa<NoneType>(slice.getSteps().getType())) steps = {1};
  else if (!constantInts(slice.getSteps(), steps)) return false;
  if (axes.size() != 1 || steps.size() != 1 || steps[0] != 1) return false;
  p = {slice.getData(), slice, axisOf(axes[0], x), 0, 0};
  if (p.axis < 0) return false;
  const int64_t dim = x[size_t(p.axis)];
  auto clampIndex = [dim](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + dim : i, 0, dim); };
  p.begin = clampIndex(starts[0]), p.end = clampIndex(ends[0]);
  p.views = views;
  return p.begin < p.end;
}

// The same value: one SSA value, two constants of the same elements (each
// rotary embedding its own copy of the angle tables), or two absent operands.
bool sameValue(Value a, Value b) {
  if (a == b || (isa<NoneType>(a.getType()) && isa<NoneType>(b.getType()))) return true;
  auto ca = a.getDefiningOp<ConstantOp>(), cb = b.getDefiningOp<ConstantOp>();
  return ca && cb && ca.getType() == cb.getType() && ca.getValue() == cb.getValue();
}

// q and k rotated by one rotary embedding (Llama's, Phi-3's) in layout bshd
// as the attention reads them: the same tables, positions and pairing, each
// rotation read by the attention alone.
bool sameRotation(RotaryOp q, RotaryOp k) {
  auto plain = [](RotaryOp r) {
    return r && r.getSeqAxis().value_or(0) == 1 && !r.getTransposed().value_or(0) && !r.getOutType() &&
           !r.getRotatedHeads() && r.getResult().hasOneUse() && r.getResult().getType() == r.getX().getType();
  };
  return plain(q) && plain(k) && sameValue(q.getCos(), k.getCos()) && sameValue(q.getSin(), k.getSin()) &&
         sameValue(q.getPositions(), k.getPositions()) && q.getInterleaved().value_or(0) == k.getInterleaved().value_or(0);
}

// What `a` reads of one fused projection: its q, k and v parts, and the
// rotary embedding of q and k when they are rotated.
struct FusedParts {
  Part q, k, v;
  RotaryOp rotaryQ, rotaryK;
  explicit operator bool() const { return bool(q.x); }
};

// The parts of one fused projection's output x that are `a`'s q, k and v
// (q and k perhaps rotated), side by side in that order along an axis of x
// that splits each token's values apart: the dims before it are the tokens
// (B T of them, in order: the parts' views to [B, T, h, d] are row-major),
// and each part holds its heads' h d values per token ([B, T, N] split or
// sliced along N, [B, T, H + 2 Hkv, d] by heads, an unsqueezed [B, 1, T, N],
// ...). None when `a` is not such an attention.
FusedParts fusedProjectionOf(AttentionOp a) {
  if (a.getLayout() != "bshd" || !a.getLse().empty()) return {};
  ArrayRef<int64_t> q = staticShape(a.getQ()), k = staticShape(a.getKt()), v = staticShape(a.getV());
  if (q.size() != 4 || k.size() != 4 || k != v || q[0] != k[0] || q[1] != k[1] || q[3] != k[3]) return {};
  FusedParts parts;
  parts.rotaryQ = a.getQ().getDefiningOp<RotaryOp>(), parts.rotaryK = a.getKt().getDefiningOp<RotaryOp>();
  Value qIn = a.getQ(), kIn = a.getKt();
  if (parts.rotaryQ || parts.rotaryK) {
    if (!sameRotation(parts.rotaryQ, parts.rotaryK)) return {};
    qIn = parts.rotaryQ.getX(), kIn = parts.rotaryK.getX();
  }
  Part pq, pk, pv;
  if (!partOf(qIn, pq) || !partOf(kIn, pk) || !partOf(a.getV(), pv) || pk.x != pq.x || pv.x != pq.x ||
      pk.axis != pq.axis || pv.axis != pq.axis || pq.begin != 0 || pk.begin != pq.end || pv.begin != pk.end)
    return {};
  ArrayRef<int64_t> x = staticShape(pq.x);
  const size_t axis = size_t(pq.axis);
  int64_t tokens = 1, inner = 1;
  for (size_t i = 0; i < axis; ++i) tokens *= x[i];
  for (size_t i = axis + 1; i < x.size(); ++i) inner *= x[i];
  if (tokens != q[0] * q[1] || pv.end != x[axis] || (pq.end - pq.begin) * inner != q[2] * q[3] ||
      (pk.end - pk.begin) * inner != k[2] * k[3] || (pv.end - pv.begin) * inner != k[2] * k[3])
    return {};
  parts.q = pq, parts.k = pk, parts.v = pv;
  return parts;
}

struct QkvAttentionPass : sd::impl::QkvAttentionBase<QkvAttentionPass> {
  void runOnOperation() override {
    SmallVector<AttentionOp> attentions;
    getOperation().walk([&](AttentionOp a) { attentions.push_back(a); });
    for (AttentionOp a : attentions) {
      FusedParts parts = fusedProjectionOf(a);
      if (!parts) continue;
      ArrayRef<int64_t> q = staticShape(a.getQ()), k = staticShape(a.getKt());
      OpBuilder b(a);
      // The projection's output as [B, T, H + 2 Hkv, d]: a view (none when it has that shape).
      Value qkv = GradBuilder(b, a.getLoc()).reshape(parts.q.x, {q[0], q[1], q[2] + 2 * k[2], q[3]});
      if (RotaryOp r = parts.rotaryQ) { // one rotation of the q and k heads; the v heads pass through
        auto rotated = cast<RotaryOp>(b.clone(*r));
        rotated->setOperand(0, qkv);
        rotated->setAttr("rotated_heads", b.getI64IntegerAttr(q[2] + k[2]));
        rotated.getResult().setType(cast<TensorType>(qkv.getType()));
        qkv = rotated.getResult();
      }
      SmallVector<NamedAttribute> attrs;
      for (NamedAttribute attr : a->getAttrs())
        if (attr.getName() != "layout") attrs.push_back(attr);
      attrs.push_back(b.getNamedAttr("kv_heads", b.getI64IntegerAttr(k[2])));
      auto fused = b.create<QkvAttentionOp>(a.getLoc(), TypeRange{a.getY().getType()},
                                            ValueRange{qkv, a.getMask(), a.getPositions()}, attrs);
      a.getY().replaceAllUsesWith(fused.getY());
      llvm::SetVector<Operation *> dead;
      dead.insert(a);
      if (parts.rotaryQ) dead.insert(parts.rotaryQ), dead.insert(parts.rotaryK);
      for (const Part *part : {&parts.q, &parts.k, &parts.v}) dead.insert(part->views.begin(), part->views.end());
      // The Split once (its three results), or each Slice.
      dead.insert(parts.q.op), dead.insert(parts.k.op), dead.insert(parts.v.op);
      // Each op after its readers; then the constants (and nones) nothing reads now.
      llvm::SetVector<Operation *> constants;
      for (Operation *op : dead) {
        for (Value operand : op->getOperands())
          if (Operation *c = operand.getDefiningOp(); isa_and_nonnull<ConstantOp, NoneOp>(c)) constants.insert(c);
        op->erase();
      }
      for (Operation *c : constants)
        if (c->use_empty()) c->erase();
    }
  }
};

} // namespace
