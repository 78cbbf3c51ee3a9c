// sd-autocast: runs the matrix products and attention in bf16 or fp16
// between casts (see Passes.td). The ops are edited in place: operands get a
// cast in front, results change type and get a cast back to f32 behind, so
// every other op still sees f32 and the plan's state stays f32. fp16 also
// marks the module for dynamic loss scaling (sd-autodiff, sd-optimizer).
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include <cmath>

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
    if (precision != "bf16" && precision != "fp16") {
      getOperation().emitError("sd-autocast: precision '") << precision << "' is not supported (bf16, fp16)";
      return signalPassFailure();
    }
    if (precision == "fp16") {
      if (!(lossScaleInit > 0) || !std::isfinite(lossScaleInit)) {
        getOperation().emitError("sd-autocast: the loss scale must be a positive number, got ") << lossScaleInit;
        return signalPassFailure();
      }
      if (lossScaleWindow < 1) {
        getOperation().emitError("sd-autocast: the loss scale window must be at least 1 step, got ") << lossScaleWindow;
        return signalPassFailure();
      }
      getOperation()->setAttr("sd.loss_scale_init", FloatAttr::get(Float64Type::get(&getContext()), lossScaleInit));
      getOperation()->setAttr("sd.loss_scale_window", IntegerAttr::get(IntegerType::get(&getContext(), 64), lossScaleWindow));
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
    const bool fp16 = precision == "fp16";
    Type half = fp16 ? Type(b.getF16Type()) : Type(b.getBF16Type()), f32 = b.getF32Type();
    const sd::DType halfType = fp16 ? sd::DType::F16 : sd::DType::BF16;
    bool changed = false;
    for (OpOperand &operand : op->getOpOperands())
      if (isF32Tensor(operand.get().getType())) {
        operand.set(castTo(b, op->getLoc(), operand.get(), half, halfType));
        changed = true;
      }
    if (!changed) return;
    b.setInsertionPointAfter(op);
    for (OpResult r : op->getResults()) {
      if (!isF32Tensor(r.getType())) continue;
      auto t = cast<RankedTensorType>(r.getType());
      r.setType(RankedTensorType::get(t.getShape(), half));
      Value back = castTo(b, op->getLoc(), r, f32, sd::DType::F32);
      r.replaceAllUsesExcept(back, back.getDefiningOp());
    }
  }
};

} // namespace
