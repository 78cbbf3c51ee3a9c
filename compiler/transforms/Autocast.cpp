// sd-autocast: runs the matrix products and attention in bf16 between casts
// (see Passes.td). The ops are edited in place: operands get a cast to bf16
// in front, results change type and get a cast back to f32 behind, so every
// other op still sees f32 and the plan's state stays f32.
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_AUTOCAST
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool isF32Tensor(Type t) {
  auto r = dyn_cast<RankedTensorType>(t);
  return r && r.getElementType().isF32();
}

struct AutocastPass : sd::impl::AutocastBase<AutocastPass> {
  using AutocastBase::AutocastBase;

  void runOnOperation() override {
    if (precision != "bf16") {
      getOperation().emitError("sd-autocast: precision '") << precision << "' is not supported (bf16 is)";
      return signalPassFailure();
    }
    SmallVector<Operation *> ops;
    getOperation().walk([&](Operation *op) {
      if (isa<LinearOp, MatMulOp, GemmOp, AttentionOp>(op)) ops.push_back(op);
    });
    for (Operation *op : ops) castAround(op);
  }

  Value castTo(OpBuilder &b, Location loc, Value v, Type element, sd::DType to) {
    auto t = cast<RankedTensorType>(v.getType());
    return b.create<CastOp>(loc, RankedTensorType::get(t.getShape(), element), v,
                            b.getI64IntegerAttr(int64_t(to)), IntegerAttr(), StringAttr());
  }

  void castAround(Operation *op) {
    OpBuilder b(op);
    Type bf16 = b.getBF16Type(), f32 = b.getF32Type();
    bool changed = false;
    for (OpOperand &operand : op->getOpOperands())
      if (isF32Tensor(operand.get().getType())) {
        operand.set(castTo(b, op->getLoc(), operand.get(), bf16, sd::DType::BF16));
        changed = true;
      }
    if (!changed) return;
    b.setInsertionPointAfter(op);
    for (OpResult r : op->getResults()) {
      if (!isF32Tensor(r.getType())) continue;
      auto t = cast<RankedTensorType>(r.getType());
      r.setType(RankedTensorType::get(t.getShape(), bf16));
      Value back = castTo(b, op->getLoc(), r, f32, sd::DType::F32);
      r.replaceAllUsesExcept(back, back.getDefiningOp());
    }
  }
};

} // namespace
