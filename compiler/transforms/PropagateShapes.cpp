// sd-propagate-shapes: refine result types with the shared shape rules and
// fold all-constant ops by running the CPU kernels.
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_PROPAGATESHAPES
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// Ops whose result depends only on operand shapes, not values.
bool readsOnlyShapes(StringRef contract) { return contract == "Shape" || contract == "Size"; }

struct PropagateShapesPass : sd::impl::PropagateShapesBase<PropagateShapesPass> {
  using PropagateShapesBase::PropagateShapesBase;

  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (f.isExternal()) continue;
      if (failed(propagate(f))) return signalPassFailure();
    }
  }

  LogicalResult propagate(func::FuncOp f) {
    SmallVector<Operation *> ops;
    f.walk([&](Operation *op) { ops.push_back(op); });
    for (Operation *op : ops) {
      auto compute = dyn_cast<ComputeOpInterface>(op);
      if (!compute) continue;
      OpShapeQuery q = buildShapeQuery(op);
      sd::Status s = sd::inferShapes(compute.getContractName().str(), *q.ctx);
      if (!s.isOk()) return op->emitError() << sd::describeNode(op) << ": " << s.message();
      for (unsigned i = 0; i < op->getNumResults(); ++i) {
        Type t = toTensorType(op->getContext(), q.ctx->outputs[i]);
        if (!t) return op->emitError() << sd::describeNode(op) << ": result type is unsupported";
        op->getResult(i).setType(t);
      }
      if (failed(tryFold(op, compute, q))) return failure();
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
      for (Operation *op : llvm::reverse(dead)) op->erase();
    }
    return success();
  }

  LogicalResult tryFold(Operation *op, ComputeOpInterface compute, OpShapeQuery &q) {
    StringRef contract = compute.getContractName();
    const sd::KernelDef *def = sd::cpuKernels().find(contract.str());
    if (!def) return success();
    bool shapeOnly = readsOnlyShapes(contract);
    for (unsigned i = 0; i < op->getNumOperands(); ++i) {
      bool absent = isa<NoneType>(op->getOperand(i).getType());
      if (absent) continue;
      if (shapeOnly ? !q.ctx->inputs[i].isStatic() : q.ctx->constInputs[i] == nullptr) return success();
    }
    int64_t bytes = 0; // element counts are bounded by 2^40 (inferShapes)
    for (auto &o : q.ctx->outputs) {
      if (!o.isStatic()) return success();
      bytes += o.numElements() * int64_t(sd::dtypeSize(o.dtype));
      if (bytes > maxFoldBytes) return success();
    }
    if (bytes > maxFoldBytes) return success();
    std::vector<std::vector<uint8_t>> results(op->getNumResults());
    sd::KernelContext kc{q.attrs, {}, {}, nullptr};
    for (unsigned i = 0; i < op->getNumOperands(); ++i) {
      if (const sd::TensorView *v = q.ctx->constInputs[i]) kc.inputs.push_back(*v);
      else if (isa<NoneType>(op->getOperand(i).getType())) kc.inputs.push_back(sd::TensorView{});
      else kc.inputs.push_back(sd::TensorView{nullptr, q.ctx->inputs[i].dtype, q.ctx->inputs[i].dims});
    }
    for (unsigned i = 0; i < op->getNumResults(); ++i) {
      const sd::TensorInfo &o = q.ctx->outputs[i];
      results[i].assign(size_t(o.numElements()) * sd::dtypeSize(o.dtype) + 1, 0);
      kc.outputs.push_back(sd::TensorView{results[i].data(), o.dtype, o.dims});
    }
    sd::Status s = sd::runKernel(*def, kc);
    if (!s.isOk()) return op->emitError() << sd::describeNode(op) << ": " << s.message();
    OpBuilder b(op);
    for (unsigned i = 0; i < op->getNumResults(); ++i) {
      results[i].pop_back();
      auto type = cast<ShapedType>(op->getResult(i).getType());
      DenseElementsAttr value = bytesToElements(type, results[i]);
      if (!value) return success();
      auto c = b.create<ConstantOp>(op->getLoc(), type, value);
      op->getResult(i).replaceAllUsesWith(c.getResult());
    }
    return success();
  }
};

} // namespace
