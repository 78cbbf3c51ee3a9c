// sd-fuse-gemm-epilogues: the GELU around a matrix product becomes part of
// the product's step, as cuBLASLt's epilogues apply it while the output
// tiles are still in registers (one pass over the [tokens, 4d] activations
// instead of three):
// - forward: Linear (or LinearAdd, sd-accumulate-into-gemm's Linear summed
//   onto a value) then Gelu -> sd.linear_gelu, which also gives the product
//   (`pre`) where GeluGrad reads it (training);
// - backward: Gemm (the next layer's input gradient, possibly accumulating
//   onto a C), GeluGrad on it, and the ReduceSum over rows that is the bias
//   gradient -> sd.gemm_dgelu.
// Runs after autodiff, on every entry. Each intermediate must have no other
// reader. In an autocast (half) plan the GELU runs in f32 between casts of
// the half product: Cast16(Gelu(Cast32(p))) and Cast16(GeluGrad(Cast32(g),
// Cast32(p))). Those fuse too (unless the `half` option is off): the GELU
// and its gradient then read the GEMM's f32 accumulator instead of its
// rounding to the half type, so the plan's bits change (by at most that
// rounding, before the GELU).
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

// The Cast that is v's only reader, when it gives `type`; else null.
CastOp soleCastTo(Value v, Type type) {
  if (!v.hasOneUse()) return {};
  auto cast = dyn_cast<CastOp>(*v.getUsers().begin());
  return cast && cast.getResult().getType() == type ? cast : CastOp();
}

struct FuseGemmEpiloguesPass : sd::impl::FuseGemmEpiloguesBase<FuseGemmEpiloguesPass> {
  using FuseGemmEpiloguesBase::FuseGemmEpiloguesBase;

  void runOnOperation() override {
    SmallVector<Operation *> linears;
    getOperation().walk([&](Operation *op) {
      if (isa<LinearOp, LinearAddOp>(op)) linears.push_back(op);
    });
    for (Operation *op : linears) fuseForward(op);
    SmallVector<GeluGradOp> grads;
    getOperation().walk([&](GeluGradOp op) { grads.push_back(op); });
    for (GeluGradOp op : grads) fuseBackward(op);
  }

  // Linear [-> Reshape] -> Gelu, the product otherwise read only by GeluGrad
  // (as its x); in a half plan Linear [-> Reshape] -> Cast32 -> Gelu ->
  // Cast16, GeluGrad reading the Cast32. (Exporters that flatten a layer's
  // input, as Hugging Face's GPT-2 Conv1D does, reshape the product back
  // before the GELU.)
  void fuseForward(Operation *linear) {
    Value pre = linear->getResult(0);
    if (!isFloatTensor(pre)) return;
    ReshapeOp reshape;
    if (pre.hasOneUse()) reshape = dyn_cast<ReshapeOp>(*pre.getUsers().begin());
    Value shaped = reshape ? reshape.getResult() : pre; // the product as the GELU sees it
    if (!isFloatTensor(shaped)) return;
    Type shapedType = shaped.getType();
    Value geluInput = shaped;
    CastOp widen; // the half plan's Cast32 of the product
    if (elementTypeOf(pre).isBF16() || elementTypeOf(pre).isF16()) {
      auto t = cast<RankedTensorType>(shapedType);
      widen = halfEpilogues ? soleCastTo(shaped, t.clone(Float32Type::get(t.getContext()))) : CastOp();
      if (!widen) return;
      geluInput = widen.getResult();
    }
    GeluOp gelu;
    SmallVector<GeluGradOp> grads;
    for (Operation *user : geluInput.getUsers()) {
      if (auto g = dyn_cast<GeluOp>(user); g && !gelu) gelu = g;
      else if (auto gg = dyn_cast<GeluGradOp>(user); gg && gg.getInput() == geluInput && gg.getGrad() != geluInput)
        grads.push_back(gg);
      else return;
    }
    if (!gelu || gelu.getResult().getType() != geluInput.getType()) return;
    for (GeluGradOp gg : grads)
      if (!sameApproximation(gg, gelu)) return;
    Value out = gelu.getResult();
    CastOp narrow; // the half plan's Cast16 of the GELU
    if (widen) {
      narrow = soleCastTo(out, shapedType);
      if (!narrow) return;
      out = narrow.getResult();
    }
    // At the product's place: its operands are defined there, and (half) the Cast32 GeluGrad reads follows.
    OpBuilder b(linear);
    GradBuilder g(b, FusedLoc::get(b.getContext(), {linear->getLoc(), gelu.getLoc()}));
    SmallVector<Value> operands(linear->getOperands());
    if (isa<LinearOp>(linear)) operands.push_back(g.none()); // no addend
    SmallVector<NamedAttribute> attrs(linear->getAttrs()); // its weight's ONNX origin too
    if (Attribute a = gelu->getAttr("approximate")) attrs.push_back(b.getNamedAttr("approximate", a));
    Operation *fused = g.op<LinearGeluOp>(operands, attrs, grads.empty() ? 1 : 2);
    if (g.failed() || !fused) return;
    // The results in the shape the GELU had, where the product was reshaped.
    auto asShaped = [&](Value v) { return reshape ? g.reshape(v, shapeOf(shaped)) : v; };
    Value fusedOut = asShaped(fused->getResult(0));
    Value fusedPre = grads.empty() ? Value() : asShaped(fused->getResult(1));
    if (g.failed()) return;
    out.replaceAllUsesWith(fusedOut);
    if (fusedPre) {
      if (widen) widen->setOperand(0, fusedPre);
      else
        for (GeluGradOp gg : grads) gg->setOperand(1, fusedPre);
    }
    if (narrow) narrow->erase();
    gelu->erase();
    if (widen && grads.empty()) widen->erase();
    if (reshape) reshape->erase();
    linear->erase();
  }

  // Gemm [-> Reshape] -> GeluGrad (its dy), optionally -> Reshape to the
  // Gemm's shape -> ReduceSum over rows. The Gemm may accumulate onto a C of
  // its own shape (beta 1). In a half plan GeluGrad reads Cast32s of the
  // half gradient and product, and its result is read through a Cast16.
  void fuseBackward(GeluGradOp gg) {
    Value dy = gg.getGrad(), x = gg.getInput(), result = gg.getResult();
    if (!isFloatTensor(result) || result.getType() != x.getType()) return;
    if (Value halfDy = sd::widenedHalf(dy)) {
      Value halfX = sd::widenedHalf(x);
      if (!halfEpilogues || !halfX || halfX.getType() != halfDy.getType() || !dy.hasOneUse()) return;
      CastOp narrow = soleCastTo(result, halfDy.getType());
      if (!narrow) return;
      dy = halfDy;
      x = halfX;
      result = narrow.getResult();
    }
    if (auto r = dy.getDefiningOp<ReshapeOp>()) {
      if (!r->hasOneUse()) return;
      dy = r.getLhs();
    }
    auto gemm = dy.getDefiningOp<GemmOp>();
    if (!gemm || !gemm->hasOneUse() || gemm->getAttr("alpha")) return;
    Value c = gemm.getC(); // none, or summed in whole (beta 1)
    if (!isa<NoneType>(c.getType()) && (c.getType() != gemm.getResult().getType() || !isScalarBeta(gemm, 1.0)))
      return;
    if (!isFloatTensor(gemm.getResult()) || elementTypeOf(gemm.getResult()) != elementTypeOf(result)) return;
    ArrayRef<int64_t> flat = shapeOf(gemm.getResult());
    // The 2-D gradient: the fused result when it has the Gemm's shape, and
    // its reshapes to that shape; the bias gradient, a ReduceSum of it over rows.
    SmallVector<Value> flatGrads;
    if (shapeOf(result) == flat) flatGrads.push_back(result);
    for (Operation *user : result.getUsers())
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
    Value pre = g.reshape(x, flat);
    SmallVector<NamedAttribute> attrs = g.attrsOf(gemm, {"transA", "transB"});
    if (Attribute a = gg->getAttr("approximate")) attrs.push_back(b.getNamedAttr("approximate", a));
    Operation *fused = g.op<GemmDGeluOp>({gemm.getA(), gemm.getB(), pre, c}, attrs, biasSum ? 2 : 1);
    if (g.failed() || !fused) return;
    Value grad = fused->getResult(0);
    Value shaped = g.reshape(grad, shapeOf(result));
    if (g.failed()) return;
    for (Value v : flatGrads)
      if (v != result) v.replaceAllUsesWith(grad);
    result.replaceAllUsesWith(shaped);
    if (biasSum) biasSum.getResult().replaceAllUsesWith(fused->getResult(1));
    // The replaced ops are dead now; sd-propagate-shapes removes them.
  }

  // Gemm's beta is `want` (ONNX's default, 1, when unset).
  static bool isScalarBeta(GemmOp gemm, double want) {
    auto beta = gemm->getAttrOfType<FloatAttr>("beta");
    return (beta ? beta.getValueAsDouble() : 1.0) == want;
  }
};

} // namespace
