// sd-inplace-reuse: an elementwise step may write its result into an input
// buffer whose last use is that step (same type), saving a buffer.
#include "BufferLiveness.h"
#include "PassDetail.h"
#include "Passes.h"

namespace sd {
#define GEN_PASS_DEF_INPLACEREUSE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;

namespace {

struct InPlaceReusePass : sd::impl::InPlaceReuseBase<InPlaceReusePass> {
  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (!sd::isEntry(f)) continue;
      sd::BufferLiveness live;
      live.compute(f);
      for (auto [i, step] : llvm::enumerate(live.steps)) {
        if (!sd::isElementwiseContract(step.getContract()) || step.getOutputs().size() != 1) continue;
        Value out = step.getOutputs()[0];
        auto outBuf = out.getDefiningOp<sd::ir::BufferOp>();
        if (!outBuf || outBuf.getInput()) continue;
        // Variadic Sum/Mean/Max/Min fold their operands into the output one by
        // one, so only the first operand may share the output's memory. With
        // two operands either may: the kernels fold the shared one first.
        auto inputs = step.getInputs();
        if (inputs.size() > 2) inputs = inputs.take_front(1);
        for (Value in : inputs) {
          auto inBuf = in.getDefiningOp<sd::ir::BufferOp>(); // no views: shapes must match exactly
          if (!inBuf || inBuf.getType() != outBuf.getType() || inBuf == outBuf) continue;
          auto range = live.ranges.lookup(inBuf);
          if (range.last != int64_t(i)) continue;
          // Reuse: the output now lives where the input did.
          out.replaceAllUsesWith(inBuf.getResult());
          live.ranges[inBuf].last = live.ranges.lookup(outBuf).last;
          live.ranges.erase(outBuf);
          outBuf.erase();
          break;
        }
      }
    }
  }
};

} // namespace
