// sd-fuse-gelu: recognizes the exact GELU that exporters decompose,
// x * 0.5 * (1 + erf(x / sqrt(2))), and replaces it with one sd.gelu, so it
// runs as one kernel (and, for training, one backward).
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include <cmath>

namespace sd {
#define GEN_PASS_DEF_FUSEGELU
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

using sd::isScalar;
using sd::otherOperand;
using sd::soleUser;

struct FuseGeluPass : sd::impl::FuseGeluBase<FuseGeluPass> {
  void runOnOperation() override {
    SmallVector<ErfOp> erfs;
    getOperation().walk([&](ErfOp e) { erfs.push_back(e); });
    for (ErfOp erf : erfs) tryFuse(erf);
  }

  void tryFuse(ErfOp erf) {
    // erf(x / sqrt(2)) or erf(x * (1/sqrt(2)))
    Operation *scaled = erf.getInput().getDefiningOp();
    Value x;
    if (auto div = dyn_cast_or_null<DivOp>(scaled); div && isScalar(div.getRhs(), M_SQRT2)) x = div.getLhs();
    else if (auto mul = dyn_cast_or_null<MulOp>(scaled)) {
      if (isScalar(mul.getRhs(), M_SQRT1_2)) x = mul.getLhs();
      else if (isScalar(mul.getLhs(), M_SQRT1_2)) x = mul.getRhs();
    }
    if (!x || !scaled->hasOneUse()) return;
    // 1 + erf(...)
    auto add = dyn_cast_or_null<AddOp>(soleUser(erf.getResult()));
    if (!add || !isScalar(otherOperand(add, erf.getResult()), 1.0)) return;
    // x * (1 + erf) * 0.5, in either association: (x * a) * 0.5 or (x * 0.5) * a.
    Operation *user = soleUser(add.getResult());
    auto mulA = dyn_cast_or_null<MulOp>(user);
    if (!mulA) return;
    Value other = otherOperand(mulA, add.getResult());
    Operation *last = nullptr;
    if (other == x) {
      auto half = dyn_cast_or_null<MulOp>(soleUser(mulA.getResult()));
      if (half && isScalar(otherOperand(half, mulA.getResult()), 0.5)) last = half;
    } else if (auto xHalf = other.getDefiningOp<MulOp>()) {
      if (otherOperand(xHalf, x) && isScalar(otherOperand(xHalf, x), 0.5) && xHalf->hasOneUse()) last = mulA;
    }
    if (!last || last->getResult(0).getType() != x.getType()) return;
    OpBuilder b(last);
    auto gelu = b.create<GeluOp>(FusedLoc::get(b.getContext(), {erf.getLoc(), last->getLoc()}), x.getType(), x,
                                 StringAttr());
    last->getResult(0).replaceAllUsesWith(gelu.getResult());
    // The decomposed ops are now dead; sd-propagate-shapes removes them.
  }
};

} // namespace
