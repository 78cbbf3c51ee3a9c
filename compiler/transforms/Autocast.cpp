// sd-autocast: runs the matrix products and attention in bf16 or fp16
// between casts (see Passes.td). The ops are edited in place: operands get a
// cast in front, results change type and get a cast back to f32 behind, so
// every other op still sees f32 and the plan's state stays f32. A frozen
// weight is cast once, here: its half copy becomes a frozen global of its own
// (the f32 one goes when nothing else reads it), instead of a Cast step at
// every use in every run. fp16 also marks the module for dynamic loss scaling
// (sd-autodiff, sd-optimizer).
#include "GlobalData.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "sd/format/dtype.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/SetVector.h"
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
      if (isa<LinearOp, MatMulOp, GemmOp, AttentionOp, QkvAttentionOp>(op)) ops.push_back(op);
    });
    for (Operation *op : ops) castAround(op);
    // The f32 loads nothing reads now (the half copies replaced them, or they
    // were dead already), then the weights nothing loads.
    ModuleOp module = getOperation();
    SmallVector<GlobalLoadOp> dead;
    module.walk([&](GlobalLoadOp load) {
      if (load->use_empty() && castWeights.contains(load.getGlobal())) dead.push_back(load);
    });
    for (GlobalLoadOp load : dead) load.erase();
    for (StringRef name : castWeights)
      if (auto g = SymbolTable::lookupSymbolIn(module, name); g && SymbolTable::symbolKnownUseEmpty(g, module))
        g->erase();
  }

  // The half copy of a frozen f32 weight's load, or null for anything else.
  // Rounded as the Cast kernel rounds (sd/format/dtype.h's conversions).
  Value frozenHalf(OpBuilder &b, Location loc, Value v, Type element, sd::DType to) {
    auto load = v.getDefiningOp<GlobalLoadOp>();
    if (!load) return {};
    ModuleOp module = getOperation();
    auto g = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, load.getGlobal()));
    auto t = g ? dyn_cast<RankedTensorType>(g.getType()) : RankedTensorType();
    if (!g || g.getRole() != "frozen" || !t || !t.getElementType().isF32() || !t.hasStaticShape()) return {};
    ArrayRef<float> data = sd::floatsOf(g);
    if (int64_t(data.size()) != t.getNumElements()) return {};
    std::string name = (g.getSymName() + (to == sd::DType::F16 ? ".f16" : ".bf16")).str();
    auto type = RankedTensorType::get(t.getShape(), element);
    if (!SymbolTable::lookupSymbolIn(module, name)) {
      std::vector<uint16_t> bits(data.size());
      for (size_t i = 0; i < data.size(); ++i)
        bits[i] = to == sd::DType::F16 ? sd::floatToHalf(data[i]) : sd::floatToBf16(data[i]);
      auto blob = HeapAsmResourceBlob::allocateAndCopyInferAlign(ArrayRef<uint16_t>(bits));
      sd::getOrCreateGlobal(module, name, type, "frozen", DenseResourceElementsAttr::get(type, name, std::move(blob)));
    }
    castWeights.insert(g.getSymName());
    return b.create<GlobalLoadOp>(loc, type, name);
  }

  Value castTo(OpBuilder &b, Location loc, Value v, Type element, sd::DType to) {
    auto t = cast<RankedTensorType>(v.getType());
    return b.create<CastOp>(loc, RankedTensorType::get(t.getShape(), element), v,
                            b.getI64IntegerAttr(int64_t(to)), IntegerAttr(), StringAttr());
  }

  llvm::SetVector<StringRef> castWeights;

  void castAround(Operation *op) {
    OpBuilder b(op);
    const bool fp16 = precision == "fp16";
    Type half = fp16 ? Type(b.getF16Type()) : Type(b.getBF16Type()), f32 = b.getF32Type();
    const sd::DType halfType = fp16 ? sd::DType::F16 : sd::DType::BF16;
    bool changed = false;
    for (OpOperand &operand : op->getOpOperands())
      if (isF32Tensor(operand.get().getType())) {
        Value weight = frozenHalf(b, op->getLoc(), operand.get(), half, halfType);
        operand.set(weight ? weight : castTo(b, op->getLoc(), operand.get(), half, halfType));
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
