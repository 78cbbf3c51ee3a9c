// sd-move-casts: half casts moved across the ops that only move data
// (Transpose, Reshape, Squeeze, Unsqueeze, Flatten, Slice, Split, Concat,
// Expand), so
// those move 2-byte elements instead of 4-byte ones. Autocast plans keep
// values in f32 between matrix products: attention's q, k and v are split,
// transposed in f32 and then narrowed to bf16; its gradients are widened to
// f32 and then transposed and concatenated. Two rewrites, to a fixpoint:
//   Cast(to half)(Move(x))  ->  Move(Cast(to half)(x))
//     when every result of Move is read only by casts to that one type
//     (Split: all its results); a Cast that then follows the f32 op that
//     made x is taken into it by sd-fuse-elementwise (its result type);
//   Move(Cast(to f32)(h))  ->  Cast(to f32)(Move(h))
//     when each widened operand has Move as its only reader (Concat: every
//     data operand, all from one half type); the widening may then meet a
//     narrowing (a round trip sd-fold-cast-round-trips removes) or be
//     loaded as a half operand by sd-fuse-elementwise.
// Casts commute with moving elements exactly (widening is exact; narrowing
// rounds each element alone), so the plan computes the same bits. Runs after
// autodiff, every entry.
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_MOVECASTS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// The operands of a data-moving op whose elements it moves (the others are
// shapes, axes, starts and ends); empty when `op` is not one.
SmallVector<unsigned> movedOperands(Operation *op) {
  if (isa<ConcatOp>(op)) {
    SmallVector<unsigned> all;
    for (unsigned i = 0; i < op->getNumOperands(); ++i) all.push_back(i);
    return all;
  }
  if (isa<TransposeOp, ReshapeOp, SqueezeOp, UnsqueezeOp, FlattenOp, SliceOp, SplitOp, ExpandOp>(op)) return {0};
  return {};
}

Type withElement(Type t, Type element) {
  auto ranked = dyn_cast<RankedTensorType>(t);
  return ranked ? RankedTensorType::get(ranked.getShape(), element) : Type();
}

Type elementOf(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t ? t.getElementType() : Type();
}

bool isHalf(Type t) { return t && (t.isBF16() || t.isF16()); }

// Whether every result has a ranked type (one a cast's element type can be put in).
bool rankedResults(Operation *op) {
  return llvm::all_of(op->getResultTypes(), [](Type t) { return isa<RankedTensorType>(t); });
}

// `move` rebuilt on `operands` (its moved ones replaced), results of element type `element`.
Operation *rebuild(OpBuilder &b, Operation *move, ArrayRef<unsigned> moved, ArrayRef<Value> operands, Type element) {
  Operation *copy = b.clone(*move);
  for (auto [i, v] : llvm::zip(moved, operands)) copy->setOperand(i, v);
  for (OpResult r : copy->getResults()) r.setType(withElement(r.getType(), element));
  return copy;
}

// Cast(to half)(Move(x)) -> Move(Cast(to half)(x)); true when it rewrote.
// Not across a Slice: narrowing all of x to keep a part of it is more work.
bool hoistNarrowing(Operation *move) {
  SmallVector<unsigned> moved = movedOperands(move);
  if (moved.empty() || isa<SliceOp>(move) || !rankedResults(move)) return false;
  for (unsigned i : moved)
    if (!elementOf(move->getOperand(i)) || !elementOf(move->getOperand(i)).isF32()) return false;
  Type half;
  CastOp any;
  for (OpResult r : move->getResults()) {
    if (r.use_empty()) return false; // a result nothing reads keeps nothing to narrow
    for (Operation *u : r.getUsers()) {
      auto c = dyn_cast<CastOp>(u);
      if (!c || !isHalf(elementOf(c.getResult())) || (half && elementOf(c.getResult()) != half) ||
          (any && c->getAttrDictionary() != any->getAttrDictionary()))
        return false;
      half = elementOf(c.getResult());
      any = c;
    }
  }
  OpBuilder b(move);
  SmallVector<Value> narrowed;
  for (unsigned i : moved) {
    Value x = move->getOperand(i);
    Operation *cast = b.clone(*any);
    cast->setOperand(0, x);
    cast->getResult(0).setType(withElement(x.getType(), half));
    narrowed.push_back(cast->getResult(0));
  }
  Operation *copy = rebuild(b, move, moved, narrowed, half);
  for (auto [old, now] : llvm::zip(move->getResults(), copy->getResults()))
    for (Operation *u : llvm::make_early_inc_range(old.getUsers())) {
      u->getResult(0).replaceAllUsesWith(now);
      u->erase();
    }
  move->erase();
  return true;
}

// Move(Cast(to f32)(h)) -> Cast(to f32)(Move(h)) (a cast per result of a
// Split); true when it rewrote. Not across an Expand: widening the copies
// is more work than widening h.
bool sinkWidening(Operation *move) {
  SmallVector<unsigned> moved = movedOperands(move);
  if (moved.empty() || isa<ExpandOp>(move) || !rankedResults(move)) return false;
  for (OpResult r : move->getResults())
    if (!elementOf(r) || !elementOf(r).isF32()) return false;
  Type half;
  CastOp any;
  SmallVector<Value> halves;
  for (unsigned i : moved) {
    auto c = move->getOperand(i).getDefiningOp<CastOp>();
    if (!c || !c->hasOneUse() || !isHalf(elementOf(c.getInput())) || (half && elementOf(c.getInput()) != half) ||
        (any && c->getAttrDictionary() != any->getAttrDictionary()))
      return false;
    half = elementOf(c.getInput());
    any = c;
    halves.push_back(c.getInput());
  }
  OpBuilder b(move);
  Operation *copy = rebuild(b, move, moved, halves, half);
  for (auto [old, now] : llvm::zip(move->getResults(), copy->getResults())) {
    Operation *widen = b.clone(*any);
    widen->setOperand(0, now);
    widen->getResult(0).setType(old.getType());
    old.replaceAllUsesWith(widen->getResult(0));
  }
  SmallVector<Operation *> casts;
  for (unsigned i : moved) casts.push_back(move->getOperand(i).getDefiningOp());
  move->erase();
  for (Operation *c : casts)
    if (c->use_empty()) c->erase();
  return true;
}

struct MoveCastsPass : sd::impl::MoveCastsBase<MoveCastsPass> {
  void runOnOperation() override {
    // Each rewrite moves a cast one op further; a chain of n moves takes n rounds.
    for (bool changed = true; changed;) {
      changed = false;
      SmallVector<Operation *> moves;
      getOperation().walk([&](Operation *op) {
        if (!movedOperands(op).empty()) moves.push_back(op);
      });
      for (Operation *m : moves) {
        if (hoistNarrowing(m) || sinkWidening(m)) changed = true;
      }
    }
  }
};

} // namespace
