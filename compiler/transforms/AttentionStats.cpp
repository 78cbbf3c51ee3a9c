// sd-attention-stats: the backward of a fused attention takes its forward's
// output and row statistics instead of running the forward again. A flash
// attention backward (cuDNN's SDPA) needs, per query row, the log-sum-exp of
// the scores and the output; without them it must recompute both (a whole
// forward per layer in every step). After autodiff, each AttentionGrad whose
// forward Attention is in the same entry (same q, keys, v, mask, positions
// and attributes) gets that Attention's output and its `lse` result, which
// the Attention step then writes (f32, one per query row). The CPU kernels
// compute the same gradient either way (they recompute the probabilities
// blockwise and ignore the two operands); the CUDA kernels skip the
// recomputation when cuDNN runs both steps.
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_ATTENTIONSTATS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// The forward of `grad`: an Attention on the same operands with the same attributes.
AttentionOp forwardOf(AttentionGradOp grad) {
  for (Operation *user : grad.getQ().getUsers()) {
    auto a = dyn_cast<AttentionOp>(user);
    if (a && a->getBlock() == grad->getBlock() && a.getKt() == grad.getKt() && a.getV() == grad.getV() &&
        a.getMask() == grad.getMask() && a.getPositions() == grad.getPositions() &&
        a.getScaleAttr() == grad.getScaleAttr() && a.getMaskValueAttr() == grad.getMaskValueAttr() &&
        a.getZeroMaskedRowsAttr() == grad.getZeroMaskedRowsAttr() && a.getLayoutAttr() == grad.getLayoutAttr())
      return a;
  }
  return {};
}

// The Attention again, with its row statistics as a second result.
AttentionOp withStats(AttentionOp a) {
  if (!a.getLse().empty()) return a;
  auto y = cast<RankedTensorType>(a.getY().getType());
  SmallVector<int64_t> rows(y.getShape());
  if (a.getLayout() == "bshd") rows = {rows[0], rows[2], rows[1]}; // y [B, T, H, dv] -> [B, H, T]
  else rows.pop_back();                                             // y [..., T, dv] -> [..., T]
  OpBuilder b(a);
  auto lse = RankedTensorType::get(rows, b.getF32Type());
  auto with = b.create<AttentionOp>(a.getLoc(), TypeRange{y, lse}, a->getOperands(), a->getAttrs());
  a.getY().replaceAllUsesWith(with.getY());
  a->erase();
  return with;
}

struct AttentionStatsPass : sd::impl::AttentionStatsBase<AttentionStatsPass> {
  void runOnOperation() override {
    SmallVector<AttentionGradOp> grads;
    getOperation().walk([&](AttentionGradOp g) {
      if (isa<NoneType>(g.getY().getType())) grads.push_back(g);
    });
    for (AttentionGradOp g : grads) {
      AttentionOp a = forwardOf(g);
      if (!a || !a->isBeforeInBlock(g)) continue;
      a = withStats(a);
      g->setOperand(6, a.getY());
      g->setOperand(7, a.getLse()[0]);
    }
  }
};

} // namespace
