// sd-propagate-shapes: refine result types with the shared shape rules and
// fold all-constant ops by running the CPU kernels (KernelFold.h).
#include "CountedExtents.h"
#include "KernelFold.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

namespace sd {
#define GEN_PASS_DEF_PROPAGATESHAPES
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// The operands whose shapes decide `op`'s: for an IfSelect with a known
// condition, not the branch it drops.
SmallVector<Value> operandsThatMatter(Operation *op) {
  Value taken = isa<IfSelectOp>(op) ? sd::takenBranch(op) : Value();
  if (!taken) return SmallVector<Value>(op->getOperands());
  return {op->getOperand(0), taken};
}

// A TopKBounded whose k is now known (specialization folded the shape
// arithmetic it came from) becomes a TopK, so nothing downstream sees a bound.
Operation *topKWithKnownK(TopKBoundedOp op) {
  auto k = dyn_cast_or_null<DenseElementsAttr>(constantValue(op.getK()));
  if (!k || k.getNumElements() != 1 || !isa<IntegerType>(k.getElementType())) return op;
  OpBuilder b(op);
  auto topK = b.create<TopKOp>(op.getLoc(), TypeRange{op.getValues().getType(), op.getIndices().getType()},
                               op->getOperands(), op->getAttrs());
  auto countType = RankedTensorType::get({}, b.getI64Type());
  int64_t kv = (*k.value_begin<APInt>()).getSExtValue();
  Value count = b.create<ConstantOp>(op.getLoc(), countType, DenseElementsAttr::get(countType, kv));
  op.getValues().replaceAllUsesWith(topK.getValues());
  op.getIndices().replaceAllUsesWith(topK.getIndices());
  op.getCount().replaceAllUsesWith(count);
  op->erase();
  return topK;
}

// An op whose one result has no elements (a Slice [0:0] of a counted
// value's Shape, as TorchScript's flatten() writes it) is an empty constant,
// whatever its operands hold at run time.
bool foldedEmpty(Operation *op) {
  if (op->getNumResults() != 1 || !isa<ComputeOpInterface>(op) || isa<LoopOp, IfOp>(op)) return false;
  auto type = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  if (!type || !type.hasStaticShape() || type.getNumElements() != 0 || !type.getElementType().isIntOrFloat())
    return false;
  OpBuilder b(op);
  op->getResult(0).replaceAllUsesWith(
      b.create<ConstantOp>(op->getLoc(), type, DenseElementsAttr::get(type, ArrayRef<Attribute>{})).getResult());
  return true;
}

struct PropagateShapesPass : sd::impl::PropagateShapesBase<PropagateShapesPass> {
  using PropagateShapesBase::PropagateShapesBase;

  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (f.isExternal()) continue;
      if (failed(sd::propagateShapes(f, maxFoldBytes))) return signalPassFailure();
    }
  }
};

} // namespace

LogicalResult sd::propagateShapes(func::FuncOp f, int64_t maxFoldBytes) {
  SmallVector<Operation *> ops;
  f.walk([&](Operation *op) { ops.push_back(op); });
  // An If whose condition folds only now leaves a branch that may not fit
  // these shapes (a rank-2 branch of a rank-3 model): its errors count only
  // if the branch is still used once the selects have folded.
  bool deferErrors = llvm::any_of(ops, [](Operation *op) { return isa<IfSelectOp>(op); });
  llvm::MapVector<Operation *, std::string> broken;
  sd::CountedValues counted;
  for (Operation *op : ops) {
    if (auto t = dyn_cast<TopKBoundedOp>(op)) op = topKWithKnownK(t);
    auto compute = dyn_cast<ComputeOpInterface>(op);
    // A Loop or If step's types are its bodies', fixed when they were outlined.
    if (!compute || isa<LoopOp, IfOp>(op)) continue;
    if (llvm::any_of(operandsThatMatter(op), [&](Value v) { return broken.count(v.getDefiningOp()); })) {
      broken[op] = "";
      continue;
    }
    OpShapeQuery q = buildShapeQuery(op);
    sd::Status s = sd::inferShapes(compute.getContractName().str(), *q.ctx);
    if (!s.isOk() && deferErrors) {
      broken[op] = sd::describeNode(op) + ": " + s.message();
      continue;
    }
    if (!s.isOk()) return op->emitError() << sd::describeNode(op) << ": " << s.message();
    for (unsigned i = 0; i < op->getNumResults(); ++i) {
      Type t = toTensorType(op->getContext(), q.ctx->outputs[i]);
      if (!t) return op->emitError() << sd::describeNode(op) << ": result type is unsupported";
      op->getResult(i).setType(t);
    }
    // A Cast to its own type (exporters leave them around softmax and
    // normalizations) is its input: no copy step, nothing to differentiate.
    if (auto cast = dyn_cast<CastOp>(op); cast && cast.getOutput().getType() == cast.getInput().getType() &&
                                          llvm::none_of(op->getUsers(), [](Operation *u) {
                                            return isa<func::ReturnOp>(u); // outputs keep their own buffer
                                          })) {
      cast.getOutput().replaceAllUsesWith(cast.getInput());
      continue;
    }
    if (counted.readsCounted(op) && !foldedEmpty(op)) { // a Shape of it would read the bound
      counted.visit(op);
      continue;
    }
    if (failed(sd::foldWithKernels(op, maxFoldBytes, nullptr, &q))) return failure();
    if (!op->use_empty()) counted.visit(op); // a selection that did not fold
  }
  // Keep the function signature in step with the refined return values.
  Operation *ret = f.getBody().front().getTerminator();
  f.setType(FunctionType::get(f.getContext(), f.getArgumentTypes(), ret->getOperandTypes()));
  // Constants and shape ops left without users are dead; erasing a user can
  // free its operands' producers, so iterate to a fixpoint.
  for (bool changed = true; changed;) {
    SmallVector<Operation *> dead;
    f.walk([&](Operation *op) {
      if (op->use_empty() && op->getNumResults() && isa<ComputeOpInterface, ConstantOp, NoneOp>(op))
        dead.push_back(op);
    });
    changed = !dead.empty();
    for (Operation *op : llvm::reverse(dead)) broken.erase(op), op->erase();
  }
  for (auto &[op, message] : broken)
    if (!message.empty()) return op->emitError() << message;
  return success();
}
