// sd-fuse-swiglu: recognizes the gated MLP activation of Llama-class models,
// silu(gate) * up, with silu as exporters write it (gate * Sigmoid(gate), or
// ONNX Swish with alpha 1), and replaces it with one sd.swiglu: one kernel
// forward and one backward instead of Sigmoid, two Muls and their gradients.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_FUSESWIGLU
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// The gate of silu(gate) = gate * sigmoid(gate) or Swish(gate) (alpha 1),
// when `v` is one used only by `user`; else null.
Value siluGate(Value v, Operation *user) {
  if (sd::soleUser(v) != user) return {};
  if (auto swish = v.getDefiningOp<SwishOp>())
    return !swish.getAlpha() || swish.getAlpha()->convertToDouble() == 1.0 ? swish.getInput() : Value();
  auto mul = v.getDefiningOp<MulOp>();
  if (!mul) return {};
  for (int i = 0; i < 2; ++i) {
    auto sig = mul->getOperand(unsigned(i)).getDefiningOp<SigmoidOp>();
    Value gate = mul->getOperand(unsigned(1 - i));
    if (sig && sig.getInput() == gate && sd::soleUser(sig.getResult()) == mul) return gate;
  }
  return {};
}

struct FuseSwigluPass : sd::impl::FuseSwigluBase<FuseSwigluPass> {
  void runOnOperation() override {
    SmallVector<MulOp> roots;
    getOperation().walk([&](MulOp m) { roots.push_back(m); });
    for (MulOp m : roots) tryFuse(m);
  }

  void tryFuse(MulOp mul) {
    for (int i = 0; i < 2; ++i) {
      Value gate = siluGate(mul->getOperand(unsigned(i)), mul), up = mul->getOperand(unsigned(1 - i));
      auto type = gate ? dyn_cast<RankedTensorType>(gate.getType()) : RankedTensorType();
      if (!type || !isa<FloatType>(type.getElementType()) || up.getType() != type || mul.getResult().getType() != type)
        continue;
      OpBuilder b(mul);
      GradBuilder g(b, mul.getLoc());
      Value y = g.make<SwiGLUOp>({gate, up});
      if (!y || g.failed()) return;
      mul.getResult().replaceAllUsesWith(y);
      // The decomposed ops are now dead; sd-propagate-shapes removes them.
      return;
    }
  }
};

} // namespace
