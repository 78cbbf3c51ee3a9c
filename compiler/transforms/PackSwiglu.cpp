// sd-pack-swiglu: a SwiGLU on the two halves of one projection reads them
// where that projection wrote them. sd-fuse-projections joins a frozen gate
// and up projection into one Linear [.., 2F] and a Split; the Split copies
// both halves apart every forward, and the backward's Concat copies their
// gradients together again for the projection's input gradient. SwiGLUPacked
// takes the Linear's output itself, and its gradient writes [d gate | d up]
// as the backward product reads it: neither copy is left.
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_PACKSWIGLU
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// `s` reads gate and up as the two equal halves of one Split along the last
// axis that nothing else reads: that Split.
SplitOp halvesOf(SwiGLUOp s) {
  auto split = s.getGate().getDefiningOp<SplitOp>();
  if (!split || split.getOutputs().size() != 2 || s.getGate() != split.getOutputs()[0] ||
      s.getUp() != split.getOutputs()[1] || !s.getGate().hasOneUse() || !s.getUp().hasOneUse())
    return {};
  auto in = dyn_cast<RankedTensorType>(split.getInput().getType());
  auto half = dyn_cast<RankedTensorType>(s.getGate().getType());
  if (!in || !half || !in.hasStaticShape() || half != s.getUp().getType() || in.getRank() == 0) return {};
  int64_t axis = split.getAxis().value_or(0);
  if (axis < 0) axis += in.getRank();
  if (axis != in.getRank() - 1 || in.getShape().back() != 2 * half.getShape().back()) return {};
  return split;
}

struct PackSwigluPass : sd::impl::PackSwigluBase<PackSwigluPass> {
  void runOnOperation() override {
    SmallVector<SwiGLUOp> swiglus;
    getOperation().walk([&](SwiGLUOp s) { swiglus.push_back(s); });
    for (SwiGLUOp s : swiglus) {
      SplitOp split = halvesOf(s);
      if (!split) continue;
      OpBuilder b(s);
      Value y = b.create<SwiGLUPackedOp>(s.getLoc(), s.getResult().getType(), split.getInput()).getResult();
      s.getResult().replaceAllUsesWith(y);
      s->erase();
      split->erase();
    }
  }
};

} // namespace
