// sd-accumulate-where-produced: in the entries that run a backward pass
// (accumulate, train_step), each gradient's accumulation
//   grad/<p> = grad/<p> + delta
// moves up to just after the op that computes `delta`. sd-autodiff emits
// them all after the backward, which keeps every weight's delta alive to the
// end of it (the arena holds each gradient twice over the backward); here the
// delta's buffer is free as soon as it is added. The gradient is then final
// where it is produced, in the backward's order (the last layer's first):
// sd-data-parallel buckets gradients in that order and reduces each bucket
// while the rest of the backward runs.
#include "sd/format/training_abi.h"
#include "PassDetail.h"
#include "Passes.h"
#include "llvm/ADT/DenseMap.h"

namespace sd {
#define GEN_PASS_DEF_ACCUMULATEWHEREPRODUCED
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// True when `op` (or an op nested in it) reads or writes global `name`.
bool touchesGlobal(Operation *op, StringRef name) {
  bool touched = false;
  op->walk([&](Operation *o) {
    if (auto l = dyn_cast<GlobalLoadOp>(o)) touched |= l.getGlobal() == name;
    if (auto s = dyn_cast<GlobalStoreOp>(o)) touched |= s.getGlobal() == name;
  });
  return touched;
}

struct AccumulateWhereProducedPass : sd::impl::AccumulateWhereProducedBase<AccumulateWhereProducedPass> {
  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      auto entry = f->getAttrOfType<StringAttr>("sd.entry");
      if (entry && (entry.getValue() == sd::abi::kAccumulate || entry.getValue() == sd::abi::kTrainStep)) moveUp(f);
    }
  }

  void moveUp(func::FuncOp f) {
    SmallVector<GlobalStoreOp> stores;
    for (Operation &op : f.getBody().front())
      if (auto s = dyn_cast<GlobalStoreOp>(op); s && s.getGlobal().starts_with(sd::abi::kGradPrefix)) stores.push_back(s);
    // The last op moved after each producer: accumulations of one op's
    // several gradients (LayerNorm's scale and bias) keep their order.
    llvm::DenseMap<Operation *, Operation *> lastAfter;
    for (GlobalStoreOp store : stores) {
      auto add = store.getValue().getDefiningOp<AddOp>();
      auto old = add ? add.getOperand(0).getDefiningOp<GlobalLoadOp>() : GlobalLoadOp();
      if (!old || old.getGlobal() != store.getGlobal() || !add->hasOneUse() || !old->hasOneUse()) continue;
      Operation *producer = add.getOperand(1).getDefiningOp();
      if (!producer || producer->getBlock() != store->getBlock() || !producer->isBeforeInBlock(add)) continue;
      // Nothing else from the producer (or the load, if earlier) to the store
      // may read or write the gradient: the load moves with the sum.
      Operation *first = old->isBeforeInBlock(producer) ? old.getOperation() : producer;
      bool clear = true;
      for (Operation *op = first->getNextNode(); op && op != store.getOperation() && clear; op = op->getNextNode())
        clear = op == old.getOperation() || op == add.getOperation() || !touchesGlobal(op, store.getGlobal());
      if (!clear) continue;
      Operation *&after = lastAfter[producer];
      if (!after) after = producer;
      old->moveAfter(after);
      add->moveAfter(old);
      store->moveAfter(add);
      after = store;
    }
  }
};

} // namespace
