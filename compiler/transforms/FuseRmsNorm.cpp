// sd-fuse-rmsnorm: recognizes RMSNorm as exporters decompose it (see
// Passes.td) and replaces it with one sd.rms_normalization, so it runs as
// one kernel and differentiates as one fused backward.
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_FUSERMSNORM
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// v through any casts that do not change its type (LlamaRMSNorm's .to(float32)).
Value throughIdentityCasts(Value v) {
  while (auto c = v.getDefiningOp<CastOp>()) {
    if (c.getInput().getType() != v.getType()) break;
    v = c.getInput();
  }
  return v;
}

using sd::isLastAxisMean;

struct FuseRmsNormPass : sd::impl::FuseRmsNormBase<FuseRmsNormPass> {
  void runOnOperation() override {
    SmallVector<SqrtOp> roots;
    getOperation().walk([&](SqrtOp s) { roots.push_back(s); });
    for (SqrtOp s : roots) tryFuse(s);
  }

  void tryFuse(SqrtOp sqrt) {
    // sqrt(mean(x^2) + eps)
    auto addEps = sqrt.getInput().getDefiningOp<AddOp>();
    if (!addEps) return;
    auto mean = addEps.getLhs().getDefiningOp<ReduceMeanOp>();
    std::optional<double> eps = sd::scalarValue(addEps.getRhs());
    if (!mean || !eps || !isLastAxisMean(mean)) return;
    Value x;
    if (auto pow = mean.getData().getDefiningOp<PowOp>(); pow && sd::isScalar(pow.getRhs(), 2.0)) x = pow.getLhs();
    else if (auto sq = mean.getData().getDefiningOp<MulOp>(); sq && sq.getLhs() == sq.getRhs()) x = sq.getLhs();
    if (!x) return;
    // x * (1 / s), x * reciprocal(s), or x / s
    Operation *normed = nullptr;
    Operation *user = sd::soleUser(sqrt.getResult());
    if (auto div = dyn_cast_or_null<DivOp>(user)) {
      if (div.getRhs() == sqrt.getResult() && sd::isScalar(div.getLhs(), 1.0)) {
        auto mul = dyn_cast_or_null<MulOp>(sd::soleUser(div.getResult()));
        if (mul && sd::otherOperand(mul, div.getResult()) == x) normed = mul;
      } else if (div.getRhs() == sqrt.getResult() && div.getLhs() == x) {
        normed = div;
      }
    } else if (auto rec = dyn_cast_or_null<ReciprocalOp>(user)) {
      auto mul = dyn_cast_or_null<MulOp>(sd::soleUser(rec.getResult()));
      if (mul && sd::otherOperand(mul, rec.getResult()) == x) normed = mul;
    }
    if (!normed) return;
    // (cast) * scale, scale a vector over the last axis
    Value consumed;
    auto scaleMul = dyn_cast_or_null<MulOp>(sd::soleUserThroughCasts(normed->getResult(0), consumed));
    Value scale = scaleMul ? sd::otherOperand(scaleMul, consumed) : Value();
    auto xt = dyn_cast<RankedTensorType>(x.getType());
    auto st = scale ? dyn_cast<RankedTensorType>(scale.getType()) : RankedTensorType();
    if (!xt || !st || !isa<FloatType>(xt.getElementType()) || st.getRank() != 1 ||
        st.getDimSize(0) != xt.getDimSize(xt.getRank() - 1) || st.getElementType() != xt.getElementType() ||
        scaleMul.getResult().getType() != x.getType())
      return;
    Value input = throughIdentityCasts(x);
    if (input.getType() != x.getType()) input = x;
    OpBuilder b(scaleMul);
    Location loc = FusedLoc::get(b.getContext(), {mean.getLoc(), scaleMul.getLoc()});
    GradBuilder g(b, loc);
    Operation *rms = g.op<RMSNormalizationOp>(
        {input, scale}, {g.attr("axis", int64_t(-1)), b.getNamedAttr("epsilon", b.getF32FloatAttr(float(*eps)))}, 1);
    if (!rms) return;
    scaleMul.getResult().replaceAllUsesWith(rms->getResult(0));
    // The decomposed ops are now dead; sd-propagate-shapes removes them.
  }
};

} // namespace
