// sd-fuse-hardswish: in inference entries, recognizes HardSwish as exporters
// that lack the op write it (paddle2onnx, older opsets), x * Clip(x + 3, 0, 6) / 6
// (the division also as * (1/6), before or after the product), and replaces
// it with one sd.hard_swish: one pass over the tensor instead of four, and a
// form sd-fuse-conv-epilogue then folds into the convolution before it.
// Training entries keep the separate ops (HardSwish has no gradient rule).
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_FUSEHARDSWISH
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

using sd::isScalar;
using sd::otherOperand;
using sd::soleUser;

// `op` divides its first operand by 6 or multiplies either operand by 1/6;
// returns the operand that is scaled, or null.
Value sixthOf(Operation *op) {
  if (auto div = dyn_cast_or_null<DivOp>(op); div && isScalar(div.getRhs(), 6.0)) return div.getLhs();
  if (auto mul = dyn_cast_or_null<MulOp>(op)) {
    if (isScalar(mul.getRhs(), 1.0 / 6.0)) return mul.getLhs();
    if (isScalar(mul.getLhs(), 1.0 / 6.0)) return mul.getRhs();
  }
  return {};
}

struct FuseHardSwishPass : sd::impl::FuseHardSwishBase<FuseHardSwishPass> {
  void runOnOperation() override {
    SmallVector<ClipOp> clips = sd::opsOfInferenceEntries<ClipOp>(getOperation());
    for (ClipOp clip : clips) tryFuse(clip);
  }

  void tryFuse(ClipOp clip) {
    // Clip(x + 3, 0, 6)
    if (isa<NoneType>(clip.getMin().getType()) || isa<NoneType>(clip.getMax().getType()) ||
        !isScalar(clip.getMin(), 0.0) || !isScalar(clip.getMax(), 6.0))
      return;
    auto add = clip.getInput().getDefiningOp<AddOp>();
    if (!add || !add->hasOneUse()) return;
    Value x = isScalar(add.getRhs(), 3.0) ? add.getLhs() : isScalar(add.getLhs(), 3.0) ? add.getRhs() : Value();
    auto type = x ? dyn_cast<RankedTensorType>(x.getType()) : RankedTensorType();
    if (!type || !type.getElementType().isF32() || clip.getResult().getType() != type) return;
    // (x * clip) / 6, or x * (clip / 6)
    Operation *user = soleUser(clip.getResult()), *last = nullptr;
    SmallVector<Operation *> chain = {clip, add};
    if (auto mul = dyn_cast_or_null<MulOp>(user); mul && otherOperand(mul, clip.getResult()) == x) {
      Operation *scale = soleUser(mul.getResult());
      if (scale && sixthOf(scale) == mul.getResult()) last = scale, chain.push_back(mul);
    } else if (user && sixthOf(user) == clip.getResult()) {
      auto mul = dyn_cast_or_null<MulOp>(soleUser(user->getResult(0)));
      if (mul && otherOperand(mul, user->getResult(0)) == x) last = mul, chain.push_back(user);
    }
    if (!last || last->getResult(0).getType() != type) return;
    OpBuilder b(last);
    SmallVector<Location> locs;
    for (Operation *op : chain) locs.push_back(op->getLoc());
    locs.push_back(last->getLoc());
    auto hs = b.create<HardSwishOp>(FusedLoc::get(b.getContext(), locs), type, x);
    last->getResult(0).replaceAllUsesWith(hs.getResult());
    // Erased now (users first), so x's sole user is the HardSwish (sd-fuse-conv-epilogue).
    last->erase();
    chain.back()->erase(); // the product or the division before `last`
    clip->erase();
    add->erase();
  }
};

} // namespace
