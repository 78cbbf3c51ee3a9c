// sd-half-elementwise: an op whose kernels compute each element in f32
// whatever its storage type (SwiGLU and its gradient: a half kernel widens
// its operands exactly, does the f32 math and rounds its results as the Cast
// kernel rounds) runs on the half values when autocast left it between casts:
// every operand a bf16 (or f16) value widened to f32, every result only
// narrowed back to that type. The same bits as before, without the casts
// (a memory pass each, over Llama's widest activations) and with the op
// itself moving half the bytes. Runs after sd-move-casts has put the casts
// next to the ops.
#include "PassDetail.h"
#include "Passes.h"

namespace sd {
#define GEN_PASS_DEF_HALFELEMENTWISE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

Type elementOf(Value v) { return cast<ShapedType>(v.getType()).getElementType(); }

// The half value `v` widens (v = Cast(to f32)(h), h bf16 or f16), else null.
Value widenedHalf(Value v) {
  auto c = v.getDefiningOp<CastOp>();
  if (!c || !elementOf(v).isF32()) return {};
  Type from = elementOf(c.getInput());
  return from.isBF16() || from.isF16() ? c.getInput() : Value();
}

// Every user of `r` casts it to `half` (and there is one).
bool onlyNarrowedTo(Value r, Type half) {
  return !r.use_empty() && llvm::all_of(r.getUsers(), [&](Operation *u) {
    auto c = dyn_cast<CastOp>(u);
    return c && elementOf(c.getResult()) == half;
  });
}

struct HalfElementwisePass : sd::impl::HalfElementwiseBase<HalfElementwisePass> {
  void runOnOperation() override {
    SmallVector<Operation *> ops;
    getOperation().walk([&](Operation *op) {
      if (isa<SwiGLUOp, SwiGLUGradOp>(op)) ops.push_back(op);
    });
    for (Operation *op : ops) runInHalf(op);
  }

  void runInHalf(Operation *op) {
    SmallVector<Value> halves;
    for (Value v : op->getOperands()) halves.push_back(widenedHalf(v));
    if (llvm::any_of(halves, [](Value h) { return !h; })) return;
    Type half = elementOf(halves[0]);
    if (llvm::any_of(halves, [&](Value h) { return elementOf(h) != half; })) return;
    if (!llvm::all_of(op->getResults(), [&](Value r) { return onlyNarrowedTo(r, half); })) return;
    OpBuilder b(op);
    Operation *inHalf = b.clone(*op);
    for (auto [i, h] : llvm::enumerate(halves)) inHalf->setOperand(unsigned(i), h);
    SmallVector<Operation *> widenings;
    for (Value v : op->getOperands()) widenings.push_back(v.getDefiningOp());
    for (auto [r, h] : llvm::zip(op->getResults(), inHalf->getResults())) {
      h.setType(cast<RankedTensorType>(r.getType()).clone(half));
      for (Operation *narrowing : llvm::make_early_inc_range(r.getUsers())) {
        narrowing->getResult(0).replaceAllUsesWith(h);
        narrowing->erase();
      }
    }
    op->erase();
    for (Operation *w : widenings)
      if (w->use_empty()) w->erase();
  }
};

} // namespace
