// sd-rematerialize-dequant: each reader of a dequantized weight (the chain
// sd-quantize-nf4 builds, its last op marked sd.dequantized) gets its own
// copy of the chain just before it, and the shared chain goes. A load and
// its dequantization then live only across the one op that reads them, so
// the arena never holds a whole f32 weight for longer, and autodiff's
// backward reads (dX = dY W) dequantize again rather than keeping the
// forward's copy alive: QLoRA's memory, at the cost of repeating the cheap
// dequantization.
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace sd {
#define GEN_PASS_DEF_REMATERIALIZEDEQUANT
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;

namespace {

struct RematerializeDequantPass : sd::impl::RematerializeDequantBase<RematerializeDequantPass> {
  void runOnOperation() override {
    SmallVector<Operation *> ends;
    getOperation().walk([&](Operation *op) {
      if (op->hasAttr(sd::kDequantizedAttr)) ends.push_back(op);
    });
    for (Operation *end : ends) {
      // A mixed-precision plan's cast of the weight (sd-autocast) goes with
      // the chain: each reader then gets its own bf16/fp16 copy too.
      while (end->hasOneUse() && isa<sd::ir::CastOp>(*end->user_begin())) end = *end->user_begin();
      // The chain, inputs first: everything `end` depends on (loads, constants and the chain's ops).
      llvm::SetVector<Operation *> chain;
      collect(end, chain);
      SmallVector<OpOperand *> uses;
      for (OpOperand &u : end->getResult(0).getUses()) uses.push_back(&u);
      for (OpOperand *u : uses) {
        OpBuilder b(u->getOwner());
        IRMapping copy;
        for (Operation *op : chain) b.clone(*op, copy);
        u->set(copy.lookup(end->getResult(0)));
      }
      for (Operation *op : llvm::reverse(chain))
        if (op->use_empty()) op->erase();
    }
  }

  // Post-order: each op after the ops it reads.
  static void collect(Operation *op, llvm::SetVector<Operation *> &out) {
    if (out.contains(op)) return;
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp()) collect(def, out);
    out.insert(op);
  }
};

} // namespace
