// sd-fuse-conv-epilogue: in inference entries, Conv followed by a residual
// Add and/or an activation (Relu, Clip with constant bounds, HardSwish,
// HardSigmoid, LeakyRelu) becomes one sd.fused_conv, so the sum and the
// activation are applied to each piece of the convolution's output while it
// is in cache instead of in separate passes over the whole tensor. Training
// entries keep the separate ops (their backward reads the intermediates).
// Each intermediate must have the chain as its only user.
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include <limits>

namespace sd {
#define GEN_PASS_DEF_FUSECONVEPILOGUE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

using sd::otherOperand;
using sd::scalarValue;
using sd::soleUser;

struct Activation {
  StringRef name;
  std::optional<double> alpha, beta;
};

// The activation `op` applies, if the kernel's epilogue has it.
std::optional<Activation> activationOf(Operation *op) {
  auto floatAttr = [&](StringRef n) -> std::optional<double> {
    if (auto a = op->getAttrOfType<FloatAttr>(n)) return a.getValueAsDouble();
    return std::nullopt;
  };
  if (isa<ReluOp>(op)) return Activation{"Relu", {}, {}};
  if (isa<HardSwishOp>(op)) return Activation{"HardSwish", {}, {}};
  if (isa<HardSigmoidOp>(op)) return Activation{"HardSigmoid", floatAttr("alpha").value_or(0.2), floatAttr("beta").value_or(0.5)};
  if (isa<LeakyReluOp>(op)) return Activation{"LeakyRelu", floatAttr("alpha").value_or(0.01), {}};
  if (auto clip = dyn_cast<ClipOp>(op)) {
    // Bounds must be known now: an absent one is unbounded.
    Activation a{"Clip", -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    if (!isa<NoneType>(clip.getMin().getType())) {
      a.alpha = scalarValue(clip.getMin());
      if (!a.alpha) return std::nullopt;
    }
    if (!isa<NoneType>(clip.getMax().getType())) {
      a.beta = scalarValue(clip.getMax());
      if (!a.beta) return std::nullopt;
    }
    return a;
  }
  return std::nullopt;
}

struct FuseConvEpiloguePass : sd::impl::FuseConvEpilogueBase<FuseConvEpiloguePass> {
  void runOnOperation() override {
    SmallVector<ConvOp> convs = sd::opsOfInferenceEntries<ConvOp>(getOperation());
    for (ConvOp conv : convs) tryFuse(conv);
  }

  void tryFuse(ConvOp conv) {
    auto type = dyn_cast<RankedTensorType>(conv.getResult().getType());
    if (!type || !type.getElementType().isF32()) return;
    Value out = conv.getResult(), residual;
    Operation *last = conv, *user = soleUser(out);
    if (auto add = dyn_cast_or_null<AddOp>(user); add && add.getResult().getType() == type) {
      residual = otherOperand(add, out);
      if (residual && residual.getType() == type && residual != out) {
        last = add;
        user = soleUser(add.getResult());
      } else {
        residual = {};
      }
    }
    std::optional<Activation> act;
    if (user && user->getNumResults() == 1 && user->getResult(0).getType() == type &&
        user->getOperand(0) == last->getResult(0)) {
      act = activationOf(user);
      if (act) last = user;
    }
    if (last == conv.getOperation()) return; // nothing to fuse
    OpBuilder b(last);
    auto f32 = [&](std::optional<double> v) { return v ? FloatAttr(b.getF32FloatAttr(float(*v))) : FloatAttr(); };
    Value none = residual ? Value() : b.create<NoneOp>(conv.getLoc(), b.getNoneType()).getResult();
    OperationState st(FusedLoc::get(b.getContext(), {conv.getLoc(), last->getLoc()}), FusedConvOp::getOperationName());
    st.addOperands({conv.getX(), conv.getW(), conv.getB(), residual ? residual : none});
    st.addTypes(type);
    st.addAttributes(conv->getAttrs());
    st.addAttribute("activation", b.getStringAttr(act ? act->name : ""));
    if (act && act->alpha) st.addAttribute("activation_alpha", f32(act->alpha));
    if (act && act->beta) st.addAttribute("activation_beta", f32(act->beta));
    Operation *fused = b.create(st);
    last->getResult(0).replaceAllUsesWith(fused->getResult(0));
    // The replaced ops are now dead; sd-propagate-shapes removes them.
  }
};

} // namespace
