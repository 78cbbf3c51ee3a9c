// sd-norm-grad-sum: a LayerNorm or RMSNorm gradient computes the sums
// around it itself.
//  - Its input gradient added to the residual stream's gradient,
//    Add(g, dx), becomes the op's accumulate operand: in a pre-norm
//    transformer's backward every norm's input gradient meets the residual
//    gradient so; the Add read two f32 [tokens, d] tensors and wrote a third,
//    the norm gradient having written dx just before. The kernels round dx
//    to its type first and then add as the Add kernel adds. f32 only (the
//    residual stream of f32 and autocast plans); g must be computed before
//    the norm gradient runs.
//  - Its dy, when the Adds of several gradients make it (the normalized
//    value read by several products: LoRA's base and adapter, or q, k and v),
//    comes as those summands: Add(Cast(a), Cast(b)) wrote an f32 [tokens, d]
//    sum of two bf16 products that the norm gradient then read; now the
//    kernels read a and b and add them as the Adds did, left to right, one
//    f32 addition each. Up to four summands, all of one type (widened halves
//    of one type, or f32).
//  - Its result, the residual stream's gradient, narrowed to bf16 (or f16)
//    for the products before the norm while the next norm gradient reads it
//    in f32: the op writes the half copy too (narrow_type), as the Cast
//    rounded it, and the Cast, which read the f32 tensor again, goes.
// All keep the plan's bits.
#include "PassDetail.h"
#include "Passes.h"
#include "sd/ops/index_geometry.h"
#include "vjp/GradBuilder.h"
#include "llvm/ADT/SetVector.h"

namespace sd {
#define GEN_PASS_DEF_NORMGRADSUM
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;
using sd::widenedHalf;

namespace {

bool isF32Tensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() && t.getElementType().isF32();
}

bool isNormGrad(Operation *op) { return op && isa<LayerNormalizationGradOp, RMSNormalizationGradOp>(op); }

// Operand 3, the accumulate operand, is absent (or none).
bool hasNoAccumulate(Operation *grad) {
  return grad->getNumOperands() == 3 || isa<NoneType>(grad->getOperand(3).getType());
}

// The norm gradient whose input gradient `dx` is, when nothing else reads
// it and it has no accumulate operand yet.
Operation *normGradOf(Value dx) {
  Operation *grad = dx.getDefiningOp();
  if (!isNormGrad(grad) || dx != grad->getResult(0) || !dx.hasOneUse() || !hasNoAccumulate(grad)) return nullptr;
  return grad;
}

// An f32 Add of two operands of its own shape whose only reader is the sum
// being flattened: its operands become summands.
AddOp flattenableAdd(Value v) {
  auto add = v.getDefiningOp<AddOp>();
  if (!add || !v.hasOneUse() || !isF32Tensor(v)) return {};
  for (Value o : add->getOperands())
    if (o.getType() != v.getType()) return {};
  return add;
}

// The summands of `sum`, left to right as its Adds add them (a + b either
// way round gives the same bits, so Add(leaf, tree) is tree + leaf; a tree
// on both sides keeps its right one whole), and the Adds.
void summandsOf(Value sum, SmallVector<Value> &terms, SmallVector<Operation *> &adds) {
  AddOp add = flattenableAdd(sum);
  if (!add) return terms.push_back(sum);
  adds.push_back(add);
  Value lhs = add.getOperand(0), rhs = add.getOperand(1);
  if (!flattenableAdd(lhs) && flattenableAdd(rhs)) std::swap(lhs, rhs);
  summandsOf(lhs, terms, adds);
  terms.push_back(rhs);
}

struct NormGradSumPass : sd::impl::NormGradSumBase<NormGradSumPass> {
  void runOnOperation() override {
    SmallVector<Operation *> grads;
    getOperation().walk([&](Operation *op) {
      if (isNormGrad(op) && op->getNumOperands() <= 4) grads.push_back(op);
    });
    for (Operation *grad : grads) takeDySummands(grad);
    SmallVector<AddOp> adds;
    getOperation().walk([&](AddOp add) { adds.push_back(add); });
    for (AddOp add : adds) takeAccumulate(add);
    grads.clear();
    getOperation().walk([&](Operation *op) {
      if (isNormGrad(op)) grads.push_back(op);
    });
    for (Operation *grad : grads) writeNarrowedCopy(grad);
  }

  // Casts of dx (an f32 x's) to one half type: the op writes that rounding itself, one result more.
  static void writeNarrowedCopy(Operation *grad) {
    Value dx = grad->getResult(0);
    if (grad->hasAttr("narrow_type") || !isF32Tensor(dx) || !elementTypeOf(grad->getOperand(1)).isF32()) return;
    SmallVector<CastOp> casts;
    Type half;
    for (Operation *user : dx.getUsers()) {
      auto cast = dyn_cast<CastOp>(user);
      Type to = cast ? elementTypeOf(cast.getResult()) : Type();
      if (!to || !(to.isBF16() || to.isF16()) || (half && to != half)) continue;
      half = to;
      casts.push_back(cast);
    }
    if (casts.empty()) return;
    OpBuilder b(grad);
    OperationState state(grad->getLoc(), grad->getName());
    state.addOperands(grad->getOperands());
    state.addAttributes(grad->getAttrs());
    state.addAttribute("narrow_type", b.getI64IntegerAttr(half.isBF16() ? 16 : 10));
    state.addTypes(grad->getResultTypes());
    state.addTypes(casts[0].getResult().getType());
    Operation *narrowing = b.create(state);
    for (CastOp cast : casts) {
      cast.getResult().replaceAllUsesWith(narrowing->getResults().back());
      cast->erase();
    }
    grad->replaceAllUsesWith(narrowing->getResults().drop_back());
    grad->erase();
  }

  // dy = a + b (+ c + d) read as its summands (operands 4..).
  static void takeDySummands(Operation *grad) {
    Value dy = grad->getOperand(0);
    SmallVector<Value> terms;
    SmallVector<Operation *> adds;
    summandsOf(dy, terms, adds);
    if (adds.empty() || terms.size() > sd::kMaxNormGradTerms) return;
    // All widened halves of one type (read as the halves), or all f32.
    SmallVector<Value> halves;
    for (Value t : terms)
      if (Value h = widenedHalf(t)) halves.push_back(h);
    if (!halves.empty()) {
      if (halves.size() != terms.size() ||
          llvm::any_of(halves, [&](Value h) { return h.getType() != halves[0].getType(); }))
        return;
    }
    ArrayRef<Value> summands = halves.empty() ? ArrayRef<Value>(terms) : ArrayRef<Value>(halves);
    OpBuilder b(grad);
    grad->setOperand(0, summands[0]);
    if (grad->getNumOperands() == 3)
      grad->insertOperands(3, b.create<NoneOp>(grad->getLoc(), b.getNoneType()).getResult());
    grad->insertOperands(4, summands.drop_front());
    // The widening casts, each once (Add(w, w) reads one twice), go with the
    // Adds when nothing else reads them.
    llvm::SmallSetVector<Operation *, 4> casts;
    for (Value t : terms)
      if (auto cast = t.getDefiningOp<CastOp>()) casts.insert(cast);
    for (Operation *add : adds) add->dropAllReferences();
    for (Operation *add : adds) add->erase();
    for (Operation *cast : casts)
      if (cast->use_empty()) cast->erase();
  }

  // Add(g, dx), dx a norm gradient's input gradient: the norm gradient's accumulate operand.
  static void takeAccumulate(AddOp add) {
    Value sum = add.getResult();
    if (!isF32Tensor(sum)) return;
    for (unsigned i = 0; i < 2; ++i) {
      Value dx = add->getOperand(i), g = add->getOperand(1 - i);
      Operation *grad = normGradOf(dx);
      if (!grad || g.getType() != sum.getType() || dx.getType() != sum.getType() || !dominatesOp(g, grad)) continue;
      // Add is commutative bit for bit, so g + dx either way round.
      if (grad->getNumOperands() == 3) grad->insertOperands(3, g);
      else grad->setOperand(3, g);
      sum.replaceAllUsesWith(dx);
      add->erase();
      return;
    }
  }

  // `v` is available where `op` runs: a block argument of its block or an
  // earlier op's result there.
  static bool dominatesOp(Value v, Operation *op) {
    if (auto arg = dyn_cast<BlockArgument>(v)) return arg.getOwner() == op->getBlock();
    Operation *def = v.getDefiningOp();
    return def->getBlock() == op->getBlock() && def->isBeforeInBlock(op);
  }
};

} // namespace
