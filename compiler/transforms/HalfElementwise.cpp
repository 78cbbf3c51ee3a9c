// sd-half-elementwise: an op whose kernels compute in f32 whatever their
// storage type runs on the half values when autocast left it between casts:
// its operands bf16 (or f16) values widened to f32, its results only
// narrowed back to that type. A half kernel widens exactly, does the f32
// math and rounds as the Cast kernel rounds, so the bits stay those of the
// plan with the casts, without the casts (a memory pass each over the
// widest activations) and with the op moving half the bytes:
//   - SwiGLU and its gradient (Llama's gated MLP, [tokens, ffn]);
//   - Rotary, both directions, on q and k (its f32 cos/sin tables stay f32);
//   - the cross-entropy on the logits ([tokens, vocab]: 32000 wide for
//     Llama): the loss reads the bf16 logits and stays f32 (f32_loss), its
//     gradient takes them and writes the bf16 gradient the LM head's
//     backward products read;
//   - an f32 value only narrowed after RMSNorm, LayerNorm or Rotary (the
//     residual stream normalized for the next product; q and k rotated for
//     attention): the op writes the half result itself (out_type), and the
//     norms' gradients read a widened half dy as it is, as does Rotary's
//     gradient (attention's bf16 dq, dk) for its f32 result.
// Runs after sd-move-casts has put the casts next to the ops.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"

namespace sd {
#define GEN_PASS_DEF_HALFELEMENTWISE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;
using sd::widenedHalf;

namespace {

// Every user of `r` casts it to `half` (and there is one).
bool onlyNarrowedTo(Value r, Type half) {
  return !r.use_empty() && llvm::all_of(r.getUsers(), [&](Operation *u) {
    auto c = dyn_cast<CastOp>(u);
    return c && elementTypeOf(c.getResult()) == half;
  });
}

// The half type every user of `r` narrows it to, else null.
Type narrowedTo(Value r) {
  if (r.use_empty()) return {};
  auto c = dyn_cast<CastOp>(*r.getUsers().begin());
  Type t = c ? elementTypeOf(c.getResult()) : Type();
  return t && (t.isBF16() || t.isF16()) && onlyNarrowedTo(r, t) ? t : Type();
}

// Which operands an op takes as half values, which results it then gives in
// half (each must only be narrowed), whether its f32 loss needs f32_loss, and
// whether an f32 input's result is rounded by the op (out_type).
struct HalfForm {
  SmallVector<unsigned> halfOperands, halfResults;
  bool f32Loss = false, outType = false;
};

std::optional<HalfForm> halfFormOf(Operation *op) {
  if (isa<SwiGLUOp>(op)) return HalfForm{{0, 1}, {0}, false};
  if (isa<SwiGLUGradOp>(op)) return HalfForm{{0, 1, 2}, {0, 1}, false};
  if (isa<SwiGLUPackedOp>(op)) return HalfForm{{0}, {0}, false};
  if (isa<SwiGLUPackedGradOp>(op)) return HalfForm{{0, 1}, {0}, false};
  if (auto sce = dyn_cast<SoftmaxCrossEntropyLossOp>(op)) {
    // Class weights would have to be half too; a read log_prob would turn half.
    if (!isa<NoneType>(sce.getWeights().getType()) || (sce.getLogProb() && !sce.getLogProb().use_empty()))
      return std::nullopt;
    return HalfForm{{0}, {}, true};
  }
  if (isa<SoftmaxCrossEntropyLossGradOp>(op)) return HalfForm{{1}, {0}, false};
  // The f32 cos/sin tables stay f32 (the kernel reads them so); an f32 x
  // (rotated after LoRA's f32 sum) gives a rounded result.
  if (auto rotary = dyn_cast<RotaryOp>(op); rotary && elementTypeOf(rotary.getCos()).isF32()) {
    if (widenedHalf(rotary.getX()))
      return narrowedTo(rotary.getResult()) ? HalfForm{{0}, {0}} : HalfForm{{0}, {}, false, true};
    if (elementTypeOf(rotary.getX()).isF32()) return HalfForm{{}, {0}, false, true};
  }
  // Norms compute in f32 or wider: the f32 residual stream's normalized
  // result rounded by the kernel, and the gradient's half dy read as it is.
  if (isa<RMSNormalizationOp, LayerNormalizationOp>(op) && elementTypeOf(op->getOperand(0)).isF32())
    return HalfForm{{}, {0}, false, true};
  if (isa<RMSNormalizationGradOp, LayerNormalizationGradOp>(op) && elementTypeOf(op->getOperand(1)).isF32())
    return HalfForm{{0}, {}};
  return std::nullopt;
}

struct HalfElementwisePass : sd::impl::HalfElementwiseBase<HalfElementwisePass> {
  void runOnOperation() override {
    SmallVector<std::pair<Operation *, HalfForm>> candidates;
    getOperation().walk([&](Operation *op) {
      if (std::optional<HalfForm> form = halfFormOf(op)) candidates.push_back({op, *form});
    });
    for (auto &[op, form] : candidates) runInHalf(op, form);
  }

  void runInHalf(Operation *op, const HalfForm &form) {
    SmallVector<Value> halves;
    for (unsigned i : form.halfOperands)
      if (Value h = widenedHalf(op->getOperand(i))) halves.push_back(h);
    if (halves.size() != form.halfOperands.size()) return;
    Type half = halves.empty() ? narrowedTo(op->getResult(form.halfResults[0])) : elementTypeOf(halves[0]);
    if (!half) return;
    if (llvm::any_of(halves, [&](Value h) { return elementTypeOf(h) != half; })) return;
    for (unsigned r : form.halfResults)
      if (!onlyNarrowedTo(op->getResult(r), half)) return;
    OpBuilder b(op);
    Operation *inHalf = b.clone(*op);
    SmallVector<Operation *> widenings;
    for (auto [i, h] : llvm::zip(form.halfOperands, halves)) {
      widenings.push_back(op->getOperand(i).getDefiningOp());
      inHalf->setOperand(i, h);
    }
    if (form.f32Loss) inHalf->setAttr("f32_loss", b.getI64IntegerAttr(1));
    // ONNX's codes: the half result of an f32 input, or the f32 one (1) of a half input.
    if (form.outType)
      inHalf->setAttr("out_type", b.getI64IntegerAttr(form.halfResults.empty() ? 1 : half.isBF16() ? 16 : 10));
    for (unsigned r : form.halfResults) {
      Value h = inHalf->getResult(r);
      h.setType(cast<RankedTensorType>(h.getType()).clone(half));
      for (Operation *narrowing : llvm::make_early_inc_range(op->getResult(r).getUsers())) {
        narrowing->getResult(0).replaceAllUsesWith(h);
        narrowing->erase();
      }
    }
    op->replaceAllUsesWith(inHalf);
    op->erase();
    for (Operation *w : widenings)
      if (w->use_empty()) w->erase();
  }
};

} // namespace
