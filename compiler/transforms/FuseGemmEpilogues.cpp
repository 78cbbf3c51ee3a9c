// sd-fuse-gemm-epilogues: the GELU around a matrix product becomes part of
// the product's step, as cuBLASLt's epilogues apply it while the output
// tiles are still in registers (one pass over the [tokens, 4d] activations
// instead of three):
// - forward: Linear then Gelu -> sd.linear_gelu, which also gives the
//   product (`pre`) where GeluGrad reads it (training);
// - backward: Gemm (the next layer's input gradient), GeluGrad on it, and
//   the ReduceSum over rows that is the bias gradient -> sd.gemm_dgelu.
// Runs after autodiff, on every entry. Each intermediate must have no other
// reader. Same element type throughout (f32 plans; an autocast plan's GELU
// runs in f32 on a cast of the bf16 product, and is left alone).
#include "vjp/GradBuilder.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_FUSEGEMMEPILOGUES
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool sameApproximation(Operation *a, Operation *b) {
  auto of = [](Operation *op) {
    auto s = op->getAttrOfType<StringAttr>("approximate");
    return s ? s.getValue() : StringRef("none");
  };
  return of(a) == of(b);
}

bool isFloatTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() && isa<FloatType>(t.getElementType());
}

struct FuseGemmEpiloguesPass : sd::impl::FuseGemmEpiloguesBase<FuseGemmEpiloguesPass> {
  void runOnOperation() override {
    SmallVector<LinearOp> linears;
    getOperation().walk([&](LinearOp op) { linears.push_back(op); });
    for (LinearOp op : linears) fuseForward(op);
    SmallVector<GeluGradOp> grads;
    getOperation().walk([&](GeluGradOp op) { grads.push_back(op); });
    for (GeluGradOp op : grads) fuseBackward(op);
  }

  // Linear -> Gelu, the product otherwise read only by GeluGrad (as its x).
  void fuseForward(LinearOp linear) {
    Value pre = linear.getResult();
    if (!isFloatTensor(pre)) return;
    GeluOp gelu;
    SmallVector<GeluGradOp> grads;
    for (Operation *user : pre.getUsers()) {
      if (auto g = dyn_cast<GeluOp>(user); g && !gelu) gelu = g;
      else if (auto gg = dyn_cast<GeluGradOp>(user); gg && gg.getInput() == pre && gg.getGrad() != pre) grads.push_back(gg);
      else return;
    }
    if (!gelu || gelu.getResult().getType() != pre.getType()) return;
    for (GeluGradOp gg : grads)
      if (!sameApproximation(gg, gelu)) return;
    OpBuilder b(gelu);
    OperationState st(FusedLoc::get(b.getContext(), {linear.getLoc(), gelu.getLoc()}), LinearGeluOp::getOperationName());
    st.addOperands(linear->getOperands());
    st.addAttributes(linear->getAttrs());
    if (Attribute a = gelu->getAttr("approximate")) st.addAttribute("approximate", a);
    st.addTypes(pre.getType());
    if (!grads.empty()) st.addTypes(pre.getType());
    Operation *fused = b.create(st);
    gelu.getResult().replaceAllUsesWith(fused->getResult(0));
    for (GeluGradOp gg : grads) gg->setOperand(1, fused->getResult(1));
    gelu->erase();
    linear->erase();
  }

  // Gemm [-> Reshape] -> GeluGrad (its dy), optionally -> Reshape to the
  // Gemm's shape -> ReduceSum over rows.
  void fuseBackward(GeluGradOp gg) {
    Value dy = gg.getGrad();
    if (auto r = dy.getDefiningOp<ReshapeOp>()) {
      if (!r->hasOneUse()) return;
      dy = r.getLhs();
    }
    auto gemm = dy.getDefiningOp<GemmOp>();
    if (!gemm || !gemm->hasOneUse() || !isa<NoneType>(gemm.getC().getType())) return;
    if (gemm->getAttr("alpha") || gemm->getAttr("beta")) return;
    if (!isFloatTensor(gemm.getResult()) || gg.getResult().getType() != gg.getInput().getType() ||
        cast<ShapedType>(gemm.getResult().getType()).getElementType() != elementTypeOf(gg.getResult()))
      return;
    ArrayRef<int64_t> flat = shapeOf(gemm.getResult());
    // The 2-D gradient: GeluGrad's result when it has the Gemm's shape, and
    // its reshapes to that shape; the bias gradient, a ReduceSum of it over rows.
    SmallVector<Value> flatGrads;
    if (shapeOf(gg.getResult()) == flat) flatGrads.push_back(gg.getResult());
    for (Operation *user : gg.getResult().getUsers())
      if (auto r = dyn_cast<ReshapeOp>(user); r && shapeOf(r.getResult()) == flat) flatGrads.push_back(r.getResult());
    ReduceSumOp biasSum;
    for (Value v : flatGrads)
      for (Operation *u : v.getUsers()) {
        auto sum = dyn_cast<ReduceSumOp>(u);
        SmallVector<int64_t> axes;
        if (sum && !biasSum && constantInts(sum.getAxes(), axes) && axes.size() == 1 && axes[0] == 0 &&
            sum.getKeepdims().value_or(1) == 0)
          biasSum = sum;
      }
    OpBuilder b(gg);
    GradBuilder g(b, FusedLoc::get(b.getContext(), {gemm.getLoc(), gg.getLoc()}));
    Value pre = g.reshape(gg.getInput(), flat);
    SmallVector<NamedAttribute> attrs = g.attrsOf(gemm, {"transA", "transB"});
    if (Attribute a = gg->getAttr("approximate")) attrs.push_back(b.getNamedAttr("approximate", a));
    Operation *fused = g.op<GemmDGeluOp>({gemm.getA(), gemm.getB(), pre}, attrs, biasSum ? 2 : 1);
    if (g.failed() || !fused) return;
    Value grad = fused->getResult(0);
    Value shaped = g.reshape(grad, shapeOf(gg.getResult()));
    if (g.failed()) return;
    for (Value v : flatGrads)
      if (v != gg.getResult()) v.replaceAllUsesWith(grad);
    gg.getResult().replaceAllUsesWith(shaped);
    if (biasSum) biasSum.getResult().replaceAllUsesWith(fused->getResult(1));
    // The replaced ops are dead now; sd-propagate-shapes removes them.
  }
};

} // namespace
