// sd-fuse-layernorm: recognizes LayerNorm as exporters before opset 17 write
// it, (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * scale [+ bias] over
// the last axis, and replaces it with one sd.layer_normalization, so it runs
// as one kernel and differentiates as one fused backward.
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_FUSELAYERNORM
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

using sd::isLastAxisMean;
using sd::scalarValue;

// A 1-D operand with the normalized dimension's size.
bool isFeatureVector(Value v, int64_t n) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getRank() == 1 && t.getDimSize(0) == n && n >= 0;
}

struct FuseLayerNormPass : sd::impl::FuseLayerNormBase<FuseLayerNormPass> {
  void runOnOperation() override {
    SmallVector<DivOp> divs;
    getOperation().walk([&](DivOp d) { divs.push_back(d); });
    for (DivOp d : divs) tryFuse(d);
  }

  void tryFuse(DivOp div) {
    // div = d / sqrt(mean(d^2) + eps), d = x - mean(x)
    auto sub = div.getLhs().getDefiningOp<SubOp>();
    auto sqrt = div.getRhs().getDefiningOp<SqrtOp>();
    if (!sub || !sqrt) return;
    auto mean = sub.getRhs().getDefiningOp<ReduceMeanOp>();
    Value x = sub.getLhs();
    if (!mean || mean.getData() != x || !isLastAxisMean(mean)) return;
    auto addEps = sqrt.getInput().getDefiningOp<AddOp>();
    if (!addEps) return;
    auto var = addEps.getLhs().getDefiningOp<ReduceMeanOp>();
    std::optional<double> eps = scalarValue(addEps.getRhs());
    if (!var || !eps || !isLastAxisMean(var)) return;
    auto pow = var.getData().getDefiningOp<PowOp>();
    auto sq = var.getData().getDefiningOp<MulOp>();
    bool squares = (pow && pow.getLhs() == sub.getResult() && sd::isScalar(pow.getRhs(), 2.0)) ||
                   (sq && sq.getLhs() == sub.getResult() && sq.getRhs() == sub.getResult());
    if (!squares) return;
    auto xt = dyn_cast<RankedTensorType>(x.getType());
    if (!xt || !isa<FloatType>(xt.getElementType())) return;
    int64_t n = xt.getDimSize(xt.getRank() - 1);
    // * scale [+ bias]
    auto mul = dyn_cast_or_null<MulOp>(sd::soleUser(div.getResult()));
    Value scale = mul ? sd::otherOperand(mul, div.getResult()) : Value();
    if (!mul || !scale || !isFeatureVector(scale, n)) return;
    Operation *last = mul;
    Value bias;
    if (auto add = dyn_cast_or_null<AddOp>(sd::soleUser(mul.getResult()))) {
      Value b = sd::otherOperand(add, mul.getResult());
      if (b && isFeatureVector(b, n)) bias = b, last = add;
    }
    if (last->getResult(0).getType() != x.getType()) return;
    OpBuilder b(last);
    Location loc = FusedLoc::get(b.getContext(), {mean.getLoc(), last->getLoc()});
    GradBuilder g(b, loc);
    SmallVector<NamedAttribute> attrs = {g.attr("axis", int64_t(-1)),
                                         b.getNamedAttr("epsilon", b.getF32FloatAttr(float(*eps)))};
    Operation *ln = g.op<LayerNormalizationOp>({x, scale, bias ? bias : g.none()}, attrs, 1);
    if (!ln) return;
    last->getResult(0).replaceAllUsesWith(ln->getResult(0));
    // The decomposed ops are now dead; sd-propagate-shapes removes them.
  }
};

} // namespace
