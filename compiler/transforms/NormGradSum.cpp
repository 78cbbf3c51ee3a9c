// sd-norm-grad-sum: a LayerNorm or RMSNorm gradient that is added to the
// residual stream's gradient, Add(g, dx), writes g + dx itself (the op's
// accumulate operand). In a pre-norm transformer's backward every norm's
// input gradient meets the residual gradient so: the Add read two f32
// [tokens, d] tensors and wrote a third, the norm gradient having written
// dx just before; now the norm gradient reads g where it writes its result,
// one tensor's round trip less per norm and one step less. The kernels
// round dx to its type first and then add as the Add kernel adds, so the
// plan computes the same bits. f32 only (the residual stream of f32 and
// autocast plans); g must be computed before the norm gradient runs.
#include "PassDetail.h"
#include "Passes.h"

namespace sd {
#define GEN_PASS_DEF_NORMGRADSUM
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool isF32Tensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() && t.getElementType().isF32();
}

// The norm gradient whose input gradient `dx` is, when nothing else reads
// it and it has no accumulate operand yet.
Operation *normGradOf(Value dx) {
  Operation *grad = dx.getDefiningOp();
  if (!grad || !isa<LayerNormalizationGradOp, RMSNormalizationGradOp>(grad)) return nullptr;
  if (dx != grad->getResult(0) || !dx.hasOneUse() || grad->getNumOperands() != 3) return nullptr;
  return grad;
}

struct NormGradSumPass : sd::impl::NormGradSumBase<NormGradSumPass> {
  void runOnOperation() override {
    SmallVector<AddOp> adds;
    getOperation().walk([&](AddOp add) { adds.push_back(add); });
    for (AddOp add : adds) {
      Value sum = add.getResult();
      if (!isF32Tensor(sum)) continue;
      for (unsigned i = 0; i < 2; ++i) {
        Value dx = add->getOperand(i), g = add->getOperand(1 - i);
        Operation *grad = normGradOf(dx);
        if (!grad || g.getType() != sum.getType() || dx.getType() != sum.getType() || !dominatesOp(g, grad))
          continue;
        // Add is commutative bit for bit, so g + dx either way round.
        grad->insertOperands(3, g);
        sum.replaceAllUsesWith(dx);
        add->erase();
        break;
      }
    }
  }

  // `v` is available where `op` runs: a block argument of its block or an
  // earlier op's result there.
  static bool dominatesOp(Value v, Operation *op) {
    if (auto arg = dyn_cast<BlockArgument>(v)) return arg.getOwner() == op->getBlock();
    Operation *def = v.getDefiningOp();
    return def->getBlock() == op->getBlock() && def->isBeforeInBlock(op);
  }
};

} // namespace
