// sd-fuse-attention: recognizes scaled-dot-product attention as exporters
// decompose it,
//   s = MatMul(q, kt) [* c | / c]  ->  [Where(mask, fill, s) | Where(keep, s, fill) | Add(s, M)]
//     ->  Softmax(last axis)  [-> casts to the same type]  ->  MatMul(p, v),
// and replaces the chain with one sd.attention, so the [..., T, S] scores
// and probabilities never become tensors and training differentiates it with
// one fused backward kernel. Every intermediate must have the chain as its
// only user (a model that also returns the attention weights keeps its ops).
#include "GlobalData.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"
#include <cmath>
#include <cstring>

namespace sd {
#define GEN_PASS_DEF_FUSEATTENTION
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool isF32(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getElementType().isF32() && t.getRank() >= 2;
}

// An additive mask M that is a constant (or a frozen weight) of zeros and one
// fill value at or below -1e30 (transformers' causal mask: the f32 minimum
// above the diagonal) as the bool mask M == fill: s + fill rounds to fill for any
// score below 1e31 in magnitude, so softmax sees the same values either way.
// M must not broadcast the scores to a larger shape.
struct BoolMask {
  RankedTensorType type;
  SmallVector<bool> masked;
  double fill;
};

// The f32 values of a constant, or of a frozen weight read whole (an
// exporter that stores the causal mask as an initializer: torch.onnx's
// dynamo exporter folds transformers' mask into one).
std::optional<std::vector<float>> knownFloats(Value m) {
  ElementsAttr value = sd::ir::constantValue(m);
  if (GlobalOp g = sd::frozenGlobalOf(m); !value && g) value = dyn_cast<ElementsAttr>(*g.getInitialValue());
  std::vector<uint8_t> bytes;
  auto t = value ? dyn_cast<RankedTensorType>(value.getType()) : RankedTensorType();
  if (!t || !t.getElementType().isF32() || !sd::ir::elementsToBytes(value, bytes)) return std::nullopt;
  std::vector<float> floats(bytes.size() / sizeof(float));
  std::memcpy(floats.data(), bytes.data(), floats.size() * sizeof(float));
  return floats;
}

// The mask's shape with leading axes dropped to 1 where every slice along
// them is the same [T, S] matrix (a causal mask the exporter repeated per
// batch item): the kernel broadcasts it, and cuDNN takes a shared mask.
SmallVector<int64_t> sharedMaskShape(ArrayRef<int64_t> shape, SmallVectorImpl<bool> &masked) {
  const size_t plane = size_t(shape[shape.size() - 2] * shape.back());
  for (size_t at = plane; at < masked.size(); at += plane)
    if (!std::equal(masked.begin(), masked.begin() + long(plane), masked.begin() + long(at)))
      return SmallVector<int64_t>(shape);
  masked.resize(plane);
  SmallVector<int64_t> one(shape.size(), 1);
  one[shape.size() - 2] = shape[shape.size() - 2], one.back() = shape.back();
  return one;
}

std::optional<BoolMask> additiveMaskAsBool(Value m, AddOp add) {
  auto mt = dyn_cast<RankedTensorType>(m.getType());
  if (!mt || !mt.hasStaticShape() || mt.getRank() < 2 || add.getResult().getType() != sd::otherOperand(add, m).getType())
    return std::nullopt;
  std::optional<std::vector<float>> values = knownFloats(m);
  if (!values) return std::nullopt;
  std::optional<float> fill;
  SmallVector<bool> masked;
  for (float x : *values) {
    bool isFill = x <= -1e30f;
    if (!isFill && x != 0.0f) return std::nullopt;
    if (isFill && fill && *fill != x) return std::nullopt;
    if (isFill) fill = x;
    masked.push_back(isFill);
  }
  if (!fill) fill = -INFINITY; // nothing masked: an all-false mask
  SmallVector<int64_t> shape = sharedMaskShape(mt.getShape(), masked);
  return BoolMask{RankedTensorType::get(shape, IntegerType::get(m.getContext(), 1)), std::move(masked), double(*fill)};
}

// Where(IsNaN(p), 0, p) over the softmax's output p, p's only two users.
WhereOp nanGuardOf(Value probs) {
  IsNaNOp isNan;
  WhereOp where;
  for (Operation *u : probs.getUsers()) {
    if (auto n = dyn_cast<IsNaNOp>(u); n && !isNan) isNan = n;
    else if (auto w = dyn_cast<WhereOp>(u); w && !where) where = w;
    else return {};
  }
  if (!isNan || !where || !isNan->hasOneUse() || where.getCondition() != isNan.getResult() ||
      where.getY() != probs || !sd::isScalar(where.getX(), 0.0) || where.getResult().getType() != probs.getType())
    return {};
  return where;
}

// A constant bool tensor with no true element.
bool isAllFalse(Value v) {
  auto dense = dyn_cast_or_null<DenseElementsAttr>(sd::ir::constantValue(v));
  if (!dense || !dense.getElementType().isInteger(1)) return false;
  for (bool b : dense.getValues<bool>())
    if (b) return false;
  return true;
}

// True when `cond` is Cast(x to bool): set exactly where x is not 0.
bool isNonZeroTestOf(Value cond, Value x) {
  auto c = cond.getDefiningOp<CastOp>();
  return c && c.getInput() == x && sd::ir::elementTypeOf(cond).isInteger(1);
}

// Add(s, Where(c, 0, fill)) or Add(s, Where(c, fill, 0)), in either operand
// order, with fill at or below -1e30 (s + fill rounds to fill, as for a
// constant additive mask) and a mask that does not broadcast the scores:
// returns the Where, sets `s` to the scores, `fill`, and `keep` when c marks
// the keys kept. Also Where(Cast(x to bool), fill, x), which is fill where x
// is not 0 and x = 0 elsewhere (transformers 4.x's BERT, as Optimum exports
// it: x = 1 - attention_mask). Null when `add` is not that.
WhereOp selectedAdditiveMask(AddOp add, Value &s, std::optional<double> &fill, bool &keep) {
  for (int i = 0; i < 2; ++i) {
    auto w = add->getOperand(unsigned(1 - i)).getDefiningOp<WhereOp>();
    if (!w || add->getOperand(unsigned(i)).getType() != add.getResult().getType()) continue;
    std::optional<double> x = sd::scalarValue(w.getX()), y = sd::scalarValue(w.getY());
    if (x && !y && *x <= -1e30 && isNonZeroTestOf(w.getCondition(), w.getY())) keep = false, fill = x;
    else if (!x || !y) continue;
    else if (*x == 0 && *y <= -1e30) keep = true, fill = y;
    else if (*y == 0 && *x <= -1e30) keep = false, fill = x;
    else continue;
    s = add->getOperand(unsigned(i));
    return w;
  }
  return {};
}

// M of ReduceMax(M, last axis, keepdims) == -inf (either operand order): the
// test for rows whose keys are all masked; null when `cond` is not that.
Value maskedRowBias(Value cond) {
  auto eq = cond.getDefiningOp<EqualOp>();
  if (!eq) return {};
  for (int i = 0; i < 2; ++i) {
    auto rm = eq->getOperand(unsigned(i)).getDefiningOp<ReduceMaxOp>();
    std::optional<double> inf = sd::scalarValue(eq->getOperand(unsigned(1 - i)));
    if (!rm || !inf || !std::isinf(*inf) || *inf > 0 || rm.getKeepdims().value_or(1) != 1) continue;
    SmallVector<int64_t> axes;
    int64_t rank = cast<RankedTensorType>(rm.getData().getType()).getRank();
    if (!sd::ir::constantInts(rm.getAxes(), axes) || axes.size() != 1 || (axes[0] != -1 && axes[0] != rank - 1))
      continue;
    return rm.getData();
  }
  return {};
}

// Some row of a [..., T, S] mask hides all S keys.
bool hasFullyMaskedRow(ArrayRef<bool> masked, ArrayRef<int64_t> shape) {
  int64_t keys = shape.empty() ? 1 : shape.back();
  for (size_t row = 0; keys > 0 && row * size_t(keys) < masked.size(); ++row)
    if (std::all_of(masked.begin() + long(row * size_t(keys)), masked.begin() + long((row + 1) * size_t(keys)),
                    [](bool m) { return m; }))
      return true;
  return false;
}

// An attention fused before the shapes were known can still read q and kt
// through constant multipliers: the scale split as sqrt(scale) on each, as
// an exporter computed it from the head size at run time (Optimum's GPT-2).
// Once they are constants they join the scale, so q and kt are the
// projections' values again (sd-attention-layout reads them in place).
void absorbScaleFactors(AttentionOp a) {
  if (a.getLayout()) return;
  double scale = a.getScale() ? a.getScale()->convertToDouble() : 1.0;
  for (unsigned operand : {0u, 1u}) {
    Value rest;
    if (MulOp mul = sd::scalarFactor(a->getOperand(operand), rest, scale)) {
      a->setOperand(operand, rest);
      mul->erase();
    }
  }
  a.setScaleAttr(FloatAttr::get(Float32Type::get(a.getContext()), scale));
}

struct FuseAttentionPass : sd::impl::FuseAttentionBase<FuseAttentionPass> {
  void runOnOperation() override {
    SmallVector<SoftmaxOp> softmaxes;
    getOperation().walk([&](SoftmaxOp s) { softmaxes.push_back(s); });
    for (SoftmaxOp s : softmaxes) tryFuse(s);
    getOperation().walk([&](AttentionOp a) { absorbScaleFactors(a); });
  }

  void tryFuse(SoftmaxOp softmax) {
    auto type = dyn_cast<RankedTensorType>(softmax.getInput().getType());
    if (!type || softmax.getCoerce2d().value_or(0)) return;
    int64_t axis = softmax.getAxis().value_or(-1);
    if (axis != -1 && axis != type.getRank() - 1) return;
    Value probs; // the softmax, maybe through casts to its own type (transformers' eager attention)
    Operation *user = sd::soleUserThroughCasts(softmax.getResult(), probs);
    // Where(IsNaN(p), 0, p): the guard SDPA exports put after the softmax for
    // rows whose keys are all masked (zero_masked_rows, below).
    WhereOp nanGuard;
    if (!user) {
      probs = softmax.getResult();
      nanGuard = nanGuardOf(probs);
      if (!nanGuard) return;
      user = sd::soleUser(nanGuard.getResult());
    }
    // Where(false, 0, p), a row guard whose condition folded to all false
    // (ONNX Attention's masked-row handling, imported, when no row is masked).
    WhereOp noGuard;
    if (auto w = dyn_cast_or_null<WhereOp>(user); w && !nanGuard && w.getY() == probs && isAllFalse(w.getCondition()) &&
                                                 w.getResult().getType() == probs.getType()) {
      noGuard = w;
      user = sd::soleUser(w.getResult());
    }
    // Where(ReduceMax(M, last axis) == -inf, 0, p): that guard as ONNX
    // Attention imports it for a mask known only at run time. M must be the
    // additive mask matched below (checked there); zero_masked_rows then.
    WhereOp rowGuard;
    Value rowGuardBias;
    if (auto w = dyn_cast_or_null<WhereOp>(user); w && !nanGuard && !noGuard && w.getY() == probs &&
                                                 sd::isScalar(w.getX(), 0.0) && w.getResult().getType() == probs.getType())
      if ((rowGuardBias = maskedRowBias(w.getCondition()))) {
        rowGuard = w;
        user = sd::soleUser(w.getResult());
      }
    Value guarded = nanGuard ? nanGuard.getResult() : noGuard ? noGuard.getResult() : rowGuard ? rowGuard.getResult() : probs;
    auto pv = dyn_cast_or_null<MatMulOp>(user);
    if (!pv || pv.getLhs() != guarded) return;
    SmallVector<Operation *> chain = {pv};
    SmallVector<Operation *> shared; // matched ops other layers may read too (a shared mask): erased once unread
    if (noGuard) chain.push_back(noGuard);
    if (rowGuard) chain.push_back(rowGuard);
    if (nanGuard) chain.push_back(nanGuard), chain.push_back(nanGuard.getCondition().getDefiningOp());
    for (Value p = probs; p != softmax.getResult(); p = p.getDefiningOp()->getOperand(0))
      chain.push_back(p.getDefiningOp());
    chain.push_back(softmax);

    // Optional mask: Where(mask, fill, scores) with a constant fill, or
    // Where(keep, scores, fill) (Hugging Face's orientation: masked = !keep).
    Value scores = softmax.getInput(), mask;
    std::optional<double> fill;
    std::optional<BoolMask> additive; // built as a constant once the whole chain matched
    bool keepMask = false;
    if (auto where = scores.getDefiningOp<WhereOp>(); where && where->hasOneUse()) {
      fill = sd::scalarValue(where.getX());
      scores = where.getY();
      if (!fill) {
        fill = sd::scalarValue(where.getY());
        scores = where.getX();
        keepMask = true;
      }
      if (!fill || rowGuardBias) return; // a row guard tests the added bias, which this form has none of
      mask = where.getCondition();
      chain.push_back(where);
    } else if (auto add = scores.getDefiningOp<AddOp>(); add && add->hasOneUse()) {
      Value s = add.getLhs(), m = add.getRhs();
      additive = additiveMaskAsBool(m, add);
      if (!additive) {
        std::swap(s, m);
        additive = additiveMaskAsBool(m, add);
      }
      if (additive) {
        scores = s;
        fill = additive->fill;
        chain.push_back(add);
      } else if (WhereOp selected = selectedAdditiveMask(add, s, fill, keepMask)) {
        // Add(s, Where(c, 0, fill)): a mask known only at run time (Optimum's,
        // from attention_mask), as Where(c, s, fill) would select it. A Where
        // that other layers' Adds share (transformers builds the mask once
        // per model) stays for them and goes once the last one is fused.
        scores = s;
        mask = selected.getCondition();
        chain.push_back(add);
        shared.push_back(selected);
      }
      if (rowGuardBias && rowGuardBias != sd::otherOperand(add, scores)) return;
    }
    const bool negInfFill = fill && std::isinf(*fill) && *fill < 0;
    if (rowGuardBias && !(negInfFill && (mask || additive))) return;
    // Optional scale: a constant multiplier or divisor.
    double scale = 1.0;
    if (Operation *def = scores.getDefiningOp(); def && def->hasOneUse() && isa<MulOp, DivOp>(def)) {
      Value lhs = def->getOperand(0), rhs = def->getOperand(1);
      std::optional<double> c = sd::scalarValue(rhs);
      if (!c && isa<MulOp>(def)) {
        c = sd::scalarValue(lhs);
        std::swap(lhs, rhs);
      }
      if (!c || *c == 0) return;
      scale = isa<DivOp>(def) ? 1.0 / *c : *c;
      scores = lhs;
      chain.push_back(def);
    }
    auto qk = scores.getDefiningOp<MatMulOp>();
    if (!qk || !qk->hasOneUse()) return;
    chain.push_back(qk);
    Value q = qk.getLhs(), kt = qk.getRhs(), v = pv.getRhs();
    // The scale split as sqrt(scale) on q and on kt (PyTorch's SDPA as
    // exported: q * sqrt(s) @ (k^T * sqrt(s))), or on k before its
    // transpose (ONNX Attention as imported: Transpose(k * sqrt(s))).
    // Users are erased before what they use: the chain lists consumers first.
    Value rest;
    TransposeOp scaledTranspose; // Transpose(k * c): k^T is rebuilt unscaled once the chain matched
    if (MulOp mul = sd::scalarFactor(q, rest, scale)) q = rest, chain.push_back(mul);
    if (MulOp mul = sd::scalarFactor(kt, rest, scale)) {
      kt = rest, chain.push_back(mul);
    } else if (auto t = kt.getDefiningOp<TransposeOp>(); t && t->hasOneUse()) {
      if (MulOp inner = sd::scalarFactor(t.getInput(), rest, scale)) {
        scaledTranspose = t;
        chain.push_back(t);
        chain.push_back(inner);
      }
    }
    // The NaN guard: only a row whose keys are all masked at -inf is NaN after
    // the softmax (a finite fill leaves it uniform, and no mask hides no row),
    // and the guard makes it 0, as the kernel does with zero_masked_rows. It
    // is set unless a constant mask shows that no row is hidden.
    bool zeroRows = (nanGuard || rowGuard) && negInfFill;
    if (zeroRows && additive && !hasFullyMaskedRow(additive->masked, additive->type.getShape())) zeroRows = false;
    if (zeroRows && mask && !keepMask)
      if (auto dense = dyn_cast_or_null<DenseElementsAttr>(sd::ir::constantValue(mask))) {
        SmallVector<bool> bits(dense.getValues<bool>().begin(), dense.getValues<bool>().end());
        zeroRows = hasFullyMaskedRow(bits, cast<RankedTensorType>(mask.getType()).getShape());
      }
    if (!isF32(q) || !isF32(kt) || !isF32(v) || !isF32(pv.getResult())) return;
    if (scaledTranspose) {
      OpBuilder tb(scaledTranspose);
      kt = tb.create<TransposeOp>(scaledTranspose.getLoc(), scaledTranspose.getResult().getType(), rest,
                                  scaledTranspose.getPermAttr())
               .getResult();
    }

    // A mask expanded over the batch (transformers: [B, 1, T, S] from
    // [1, 1, T, S]) is taken unexpanded; the kernel broadcasts it, and a
    // mask every item shares can run cuDNN's fused attention.
    if (auto expand = mask ? mask.getDefiningOp<ExpandOp>() : ExpandOp{}) {
      auto small = dyn_cast<RankedTensorType>(expand.getLhs().getType());
      auto full = dyn_cast<RankedTensorType>(mask.getType());
      if (small && full && small.hasStaticShape() && small.getRank() == full.getRank()) {
        mask = expand.getLhs();
        shared.push_back(expand);
      }
    }

    OpBuilder b(pv);
    SmallVector<Location> locs;
    for (Operation *op : chain) locs.push_back(op->getLoc());
    SmallVector<NamedAttribute> attrs = {b.getNamedAttr("scale", b.getF32FloatAttr(float(scale)))};
    if (fill) attrs.push_back(b.getNamedAttr("mask_value", b.getF32FloatAttr(float(*fill))));
    if (zeroRows) attrs.push_back(b.getNamedAttr("zero_masked_rows", b.getI64IntegerAttr(1)));
    Value none = b.create<NoneOp>(pv.getLoc(), b.getNoneType()).getResult();
    if (additive)
      mask = b.create<ConstantOp>(pv.getLoc(), additive->type,
                                  DenseElementsAttr::get(additive->type, ArrayRef<bool>(additive->masked)))
                 .getResult();
    Value maskOperand = mask ? mask : none;
    if (keepMask) maskOperand = b.create<NotOp>(pv.getLoc(), mask.getType(), mask).getResult();
    auto fused = b.create<AttentionOp>(FusedLoc::get(b.getContext(), locs), TypeRange{pv.getResult().getType()},
                                       ValueRange{q, kt, v, maskOperand, none}, attrs);
    pv.getResult().replaceAllUsesWith(fused.getY());
    for (Operation *op : chain) op->erase();
    for (Operation *op : shared)
      if (op->use_empty()) op->erase();
  }
};

} // namespace
