// sd-check-static: after specialization every value must be static and no
// shape op may remain; the error names the node so the user can fix --shapes.
#include "CountedExtents.h"
#include "PassDetail.h"
#include "Passes.h"

namespace sd {
#define GEN_PASS_DEF_CHECKSTATIC
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;

namespace {

struct CheckStaticPass : sd::impl::CheckStaticBase<CheckStaticPass> {
  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (!sd::isEntry(f)) continue;
      WalkResult r = f.walk([&](Operation *op) {
        if (isa<sd::ir::ShapeOp, sd::ir::SizeOp>(op)) {
          if (Operation *selection = sd::countedSourceOf(op->getOperand(0)))
            op->emitError() << sd::describeNode(op) << " reads how much " << sd::describeNode(selection)
                            << " selects at run time, and what it feeds needs that as a static shape: a plan's "
                               "shapes are fixed, so a selection's size can be computed with, but not reshaped or "
                               "allocated by";
          else
            op->emitError() << sd::describeNode(op) << ": shape op survives specialization";
          return WalkResult::interrupt();
        }
        for (auto [i, v] : llvm::enumerate(op->getResults())) {
          auto t = dyn_cast<ShapedType>(v.getType());
          if (t && !t.hasStaticShape()) {
            std::string shape;
            if (t.hasRank())
              for (auto [d, n] : llvm::enumerate(t.getShape()))
                shape += (d ? "x" : "") + (ShapedType::isDynamic(n) ? std::string("?") : std::to_string(n));
            else
              shape = "unranked";
            op->emitError() << sd::describeNode(op) << ": result " << i << " has dynamic shape " << shape
                            << " after specialization; bind it with --shapes or --dim";
            return WalkResult::interrupt();
          }
        }
        return WalkResult::advance();
      });
      if (r.wasInterrupted()) return signalPassFailure();
    }
  }
};

} // namespace
