// sd-liveness: record each arena buffer's live step range as `live = [a, b]`.
#include "BufferLiveness.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_LIVENESS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;

namespace {

struct LivenessPass : sd::impl::LivenessBase<LivenessPass> {
  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (!sd::isEntry(f)) continue;
      sd::BufferLiveness live;
      live.compute(f);
      Builder b(f.getContext());
      for (auto &[op, r] : live.ranges)
        cast<sd::ir::BufferOp>(op).setLiveAttr(b.getDenseI64ArrayAttr({r.first, r.last}));
    }
  }
};

} // namespace
