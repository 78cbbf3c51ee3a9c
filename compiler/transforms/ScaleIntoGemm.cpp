// sd-scale-into-gemm: a matrix product takes a constant power-of-two scale of
// its operand as its alpha instead of reading a scaled copy. LoRA's backward
// is the case: the adapter output's scale (lora_alpha / r) gives
// dy * scale, in f32, rounded to the half type for lora_B's two products,
// beside the plain rounding of dy for the base product; on the MLP's
// [tokens, 4d] gradient that is a widened f32 result and two narrowing
// passes where one rounding will do. Rewritten: the products read the
// rounding of dy itself (sd-fold-cast-round-trips then merges it with the
// base product's) and scale their result by alpha.
//
// Only a power of two: then x * s rounds to f32 or bf16 exactly as x does,
// shifted, and a product of scaled operands is the scaled product, so the
// plan computes the same bits (except where x * s leaves the type's normal
// range: f32's, at 1e-38). f16 keeps the copy (its normal range starts at
// 6e-5, where gradients live). Runs after autodiff, every entry.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include <cmath>

namespace sd {
#define GEN_PASS_DEF_SCALEINTOGEMM
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool isPowerOfTwo(double s) {
  int exponent = 0;
  return s > 0 && std::isfinite(s) && std::frexp(s, &exponent) == 0.5;
}

// Element types whose rounding a power-of-two scale commutes with.
bool scalesExactly(Type t) { return t.isF32() || t.isBF16() || t.isF64(); }

// The Gemm operands (a or b) that read `v` through Reshapes; false when
// something else reads it, or nothing does.
bool gemmReaders(Value v, SmallVectorImpl<OpOperand *> &out) {
  if (v.use_empty()) return false;
  for (OpOperand &use : v.getUses()) {
    Operation *user = use.getOwner();
    if (auto reshape = dyn_cast<ReshapeOp>(user); reshape && use.getOperandNumber() == 0) {
      if (!gemmReaders(reshape.getResult(), out)) return false;
    } else if (isa<GemmOp>(user) && use.getOperandNumber() < 2) {
      out.push_back(&use);
    } else {
      return false;
    }
  }
  return true;
}

struct ScaleIntoGemmPass : sd::impl::ScaleIntoGemmBase<ScaleIntoGemmPass> {
  void runOnOperation() override {
    SmallVector<MulOp> muls;
    getOperation().walk([&](MulOp m) { muls.push_back(m); });
    for (MulOp m : muls) rewrite(m);
  }

  void rewrite(MulOp m) {
    Value result = m.getResult(), x;
    double scale = 0;
    for (unsigned i = 0; i < 2 && !x; ++i)
      if (std::optional<double> s = sd::scalarValue(m->getOperand(1 - i)); s && isPowerOfTwo(*s)) {
        x = m->getOperand(i);
        scale = *s;
      }
    if (!x || x.getType() != result.getType() || !scalesExactly(elementTypeOf(x))) return;
    // The scaled value the products read: the product itself, or its one
    // rounding to bf16 (autocast's cast before a half product).
    Value read = result;
    CastOp rounding = result.hasOneUse() ? dyn_cast<CastOp>(*result.getUsers().begin()) : CastOp{};
    if (rounding && elementTypeOf(rounding.getResult()).isBF16()) read = rounding.getResult();
    SmallVector<OpOperand *> products;
    if (!gemmReaders(read, products)) return;
    if (read == result) result.replaceAllUsesWith(x);
    else rounding->setOperand(0, x);
    // A Gemm reading two scaled operands (or one twice) takes both scales.
    for (OpOperand *use : products) {
      auto gemm = cast<GemmOp>(use->getOwner());
      double alpha = gemm.getAlpha() ? double(gemm.getAlpha()->convertToFloat()) : 1.0;
      gemm->setAttr("alpha", FloatAttr::get(Float32Type::get(gemm->getContext()), alpha * scale));
    }
    // Erased now, not with sd-propagate-shapes: until then a reader of x
    // would keep sd-fuse-elementwise from taking the one rounding of x in.
    m->erase();
  }
};

} // namespace
