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
#include <type_traits>

namespace sd {
#define GEN_PASS_DEF_ATTENTIONSTATS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// The forward of `grad`: an Attention (QkvAttention) on the same operands
// with the same attributes.
template <typename Forward, typename Grad> Forward forwardOf(Grad grad, Value first) {
  auto sameAttrs = [&](Operation *a) {
    for (StringRef name : {"scale", "mask_value", "zero_masked_rows", "layout", "kv_heads"})
      if (a->getAttr(name) != grad->getAttr(name)) return false;
    return true;
  };
  for (Operation *user : first.getUsers()) {
    auto a = dyn_cast<Forward>(user);
    if (!a || a->getBlock() != grad->getBlock() || a.getMask() != grad.getMask() ||
        a.getPositions() != grad.getPositions() || !sameAttrs(a))
      continue;
    if constexpr (std::is_same_v<Forward, AttentionOp>)
      if (a.getQ() != grad.getQ() || a.getKt() != grad.getKt() || a.getV() != grad.getV()) continue;
    return a;
  }
  return {};
}

// The attention again, with its row statistics as a second result.
template <typename Forward> Forward withStats(Forward a, bool tokenMajor) {
  if (!a.getLse().empty()) return a;
  auto y = cast<RankedTensorType>(a.getY().getType());
  SmallVector<int64_t> rows(y.getShape());
  if (tokenMajor) rows = {rows[0], rows[2], rows[1]}; // y [B, T, H, dv] -> [B, H, T]
  else rows.pop_back();                              // y [..., T, dv] -> [..., T]
  OpBuilder b(a);
  auto lse = RankedTensorType::get(rows, b.getF32Type());
  auto with = b.create<Forward>(a.getLoc(), TypeRange{y, lse}, a->getOperands(), a->getAttrs());
  a.getY().replaceAllUsesWith(with.getY());
  a->erase();
  return with;
}

// Each gradient of `Grad` that recomputes its forward gets the forward's y
// and lse, at operands yAt and yAt + 1.
template <typename Forward, typename Grad> void takeStats(ModuleOp module, unsigned yAt) {
  SmallVector<Grad> grads;
  module.walk([&](Grad g) {
    if (isa<NoneType>(g.getY().getType())) grads.push_back(g);
  });
  for (Grad g : grads) {
    Value first = g->getOperand(1); // q, or qkv
    Forward a = forwardOf<Forward>(g, first);
    if (!a || !a->isBeforeInBlock(g)) continue;
    bool tokenMajor = true;
    if constexpr (std::is_same_v<Forward, AttentionOp>) tokenMajor = a.getLayout() == "bshd";
    a = withStats(a, tokenMajor);
    g->setOperand(yAt, a.getY());
    g->setOperand(yAt + 1, a.getLse()[0]);
  }
}

struct AttentionStatsPass : sd::impl::AttentionStatsBase<AttentionStatsPass> {
  void runOnOperation() override {
    takeStats<AttentionOp, AttentionGradOp>(getOperation(), 6);
    takeStats<QkvAttentionOp, QkvAttentionGradOp>(getOperation(), 4);
  }
};

} // namespace
