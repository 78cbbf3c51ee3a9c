// sd-bounded-extents: follows each counted result (CountedExtents.h) to the
// entry's outputs through the ops that read it (CountedFlow.h: passed on,
// made exact by masking the padding, or refused, naming both nodes). Counted
// entry results get their count as an extra, unnamed result and an
// `sd.output_extents` entry [result, count result, axis] that sd-bufferize
// turns into a counted output binding.
#include "CountedExtents.h"
#include "CountedFlow.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

namespace sd {
#define GEN_PASS_DEF_BOUNDEDEXTENTS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using sd::Extent;

namespace {

struct BoundedExtentsPass : sd::impl::BoundedExtentsBase<BoundedExtentsPass> {
  sd::CountedFlow flow;
  llvm::DenseMap<Value, Extent> &extents = flow.extents;
  std::string why; // why the current consumer cannot honour its count

  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>())
      if (sd::isEntry(f) && failed(runOnEntry(f))) return signalPassFailure();
  }

  LogicalResult runOnEntry(func::FuncOp f) {
    extents.clear();
    SmallVector<Operation *> selections;
    Block &body = f.getBody().front();
    // Dynamic shapes are sd-check-static's to report.
    for (Operation &op : body)
      for (Value r : op.getResults())
        if (auto t = dyn_cast<ShapedType>(r.getType()); t && !t.hasStaticShape()) return success();
    // Early increment: a consumer may be replaced (a Shape by its extents, a
    // mean by a sum and a division).
    for (Operation &op : llvm::make_early_inc_range(body)) {
      if (auto c = sd::countedResultsOf(&op)) {
        if (failed(refuseCountedOperands(&op))) return failure();
        if (Operation *same = earlierSame(&op, selections)) {
          op.replaceAllUsesWith(same);
          op.erase();
          continue;
        }
        selections.push_back(&op);
        for (auto [result, axis] : c->results) extents[op.getResult(result)] = Extent{op.getResult(c->count), axis, &op};
        continue;
      }
      if (isa<func::ReturnOp>(op)) return recordOutputs(f, cast<func::ReturnOp>(op));
      auto counted = llvm::make_filter_range(op.getOperands(), [&](Value v) { return extents.count(v) != 0; });
      if (counted.empty()) continue;
      Extent first = extents.lookup(*counted.begin());
      why.clear();
      for (Value v : counted)
        if (extents.lookup(v).count != first.count) why = "it combines the counts of two selections";
      if (why.empty() && succeeded(flow.follow(&op, first, why))) continue;
      return op.emitError() << sd::describeNode(&op) << " cannot honour the run-time count of "
                            << sd::describeNode(first.source) << ", which fills only part of dim " << first.axis
                            << " of its result: " << why;
    }
    return success();
  }

  // TorchScript indexes each tensor by its own NonZero of one mask
  // (pred[keep] - y[keep]): the same selection of the same operands, whose
  // counts are one count.
  static Operation *earlierSame(Operation *op, ArrayRef<Operation *> earlier) {
    for (Operation *e : earlier)
      if (OperationEquivalence::isEquivalentTo(op, e, OperationEquivalence::IgnoreLocations)) return e;
    return nullptr;
  }

  LogicalResult refuseCountedOperands(Operation *op) {
    for (Value v : op->getOperands())
      if (auto it = extents.find(v); it != extents.end()) {
        why = "a selection over a counted selection is not supported";
        return op->emitError() << sd::describeNode(op) << " cannot honour the run-time count of "
                               << sd::describeNode(it->second.source) << ": " << why;
      }
    return success();
  }

  // Appends one count result per selection the outputs depend on.
  LogicalResult recordOutputs(func::FuncOp f, func::ReturnOp ret) {
    llvm::MapVector<Value, unsigned> countIndex;
    SmallVector<Value> operands(ret.getOperands());
    SmallVector<Attribute> records;
    Builder b(f.getContext());
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      auto it = extents.find(v);
      if (it == extents.end()) continue;
      auto [slot, added] = countIndex.try_emplace(it->second.count, unsigned(operands.size()));
      if (added) operands.push_back(it->second.count);
      records.push_back(b.getDenseI64ArrayAttr({int64_t(i), int64_t(slot->second), it->second.axis}));
    }
    if (records.empty()) return success();
    ret->setOperands(operands);
    f.setType(FunctionType::get(f.getContext(), f.getArgumentTypes(), ret->getOperandTypes()));
    f->setAttr("sd.output_extents", b.getArrayAttr(records));
    return success();
  }
};

} // namespace
