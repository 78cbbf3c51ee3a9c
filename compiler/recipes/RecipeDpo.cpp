// sd-recipe-dpo: preference optimization on (chosen, rejected) completion
// pairs, as TRL's DPOTrainer computes it: DPO's sigmoid loss (Rafailov et al.
// 2023), IPO's squared loss on per-token log-ratios and the hinge loss,
// appended as sd ops to a clone of the model's forward so autodiff
// differentiates it like any other loss.
//
// Rows come in pairs: row 2i holds pair i's chosen completion, row 2i+1 its
// rejected one. Interleaved rather than TRL's [chosen; rejected] halves, so
// that a data-parallel split of a batch's rows never splits a pair.
//
// The reference model is the model as training starts. The forward is cloned
// once more, with every trainable parameter read from a `reference/<name>`
// copy (scalar state: checkpointed with the run, never optimized, outside the
// gradient). Adapters start as the identity (LoRA's zero B, IA3's ones), so
// with PEFT that is the base model, TRL's reference with adapters disabled;
// in full fine-tuning it is the initial weights, TRL's ref_model; a run that
// starts from an adapter (sdrun train --adapter, which refreshes the copies)
// measures against that adapter's model, as TRL's "ref" adapter does. Only
// ops that depend on a trainable parameter are cloned; the rest of the
// forward (the embedding lookup, layers before the first adapter) is shared.
#include "EntryInputs.h"
#include "PassDetail.h"
#include "Passes.h"
#include "RecipeLoss.h"
#include "mlir/IR/IRMapping.h"
#include "sd/format/training_abi.h"
#include "vjp/GradBuilder.h"

namespace sd {
#define GEN_PASS_DEF_RECIPEDPO
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct RecipeDpoPass : sd::impl::RecipeDpoBase<RecipeDpoPass> {
  using RecipeDpoBase::RecipeDpoBase;

  void runOnOperation() override {
    if (!(beta > 0)) {
      getOperation().emitError() << "--dpo-beta must be positive, got " << beta;
      return signalPassFailure();
    }
    if (lossType != "sigmoid" && lossType != "ipo" && lossType != "hinge") {
      getOperation().emitError() << "--dpo-loss takes 'sigmoid', 'ipo' or 'hinge', got '" << lossType << "'";
      return signalPassFailure();
    }
    func::FuncOp eval = sd::cloneInferAsEvalStep(getOperation(), tokenInput, "--recipe dpo", /*bindInputs=*/true);
    if (!eval || failed(appendPreferenceLoss(eval)))
      return signalPassFailure();
  }

  // The forward once more, on the reference copies of the trainable
  // parameters; returns what `v` is in that copy.
  FailureOr<Value> referenceForward(func::FuncOp f, Value v) {
    ModuleOp module = getOperation();
    Block &body = f.getBody().front();
    OpBuilder b(body.getTerminator());
    DenseSet<Value> varied;
    IRMapping copy;
    SmallVector<Operation *> ops;
    for (Operation &op : body.without_terminator())
      ops.push_back(&op);
    for (Operation *op : ops) {
      if (isa<GlobalStoreOp, LoopOp, IfOp>(op))
        return op->emitError() << "--recipe dpo: " << sd::describeNode(op)
                               << (isa<GlobalStoreOp>(op) ? " updates state in the forward" : " runs a body entry")
                               << ", which the reference model's copy of the forward cannot repeat";
      GlobalOp trainable;
      if (auto load = dyn_cast<GlobalLoadOp>(op)) {
        auto g = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, load.getGlobal()));
        if (g && g.getRole() == "trainable")
          trainable = g;
      }
      if (!trainable && llvm::none_of(op->getOperands(), [&](Value o) { return varied.contains(o); }))
        continue;
      Operation *c = b.clone(*op, copy);
      for (Value r : op->getResults())
        varied.insert(r);
      if (!trainable)
        continue;
      GlobalOp ref =
          sd::getOrCreateGlobal(module, std::string(sd::abi::kReferencePrefix) + trainable.getSymName().str(),
                                trainable.getType(), "scalar_state", trainable.getInitialValueAttr());
      cast<GlobalLoadOp>(c).setGlobal(ref.getSymName());
      c->removeAttr(sd::kDetachedAttr); // no gradient reaches a reference copy anyway
    }
    if (!varied.contains(v))
      return f.emitError("--recipe dpo: the logits do not depend on any trainable parameter");
    return copy.lookup(v);
  }

  // Per row: the summed log-probability of its counted labels.
  Value rowLogProb(GradBuilder &g, Value logits, const sd::TokenScores &t) {
    OpBuilder &b = g.builder();
    int64_t vocab = cast<RankedTensorType>(logits.getType()).getDimSize(2);
    Value nll = g.make<SoftmaxCrossEntropyLossOp>(
        {g.reshape(logits, {-1, vocab}), t.nextLabels, g.none()},
        {b.getNamedAttr("reduction", b.getStringAttr("none")), g.attr("ignore_index", sd::kIgnoreIndex)});
    return g.neg(g.reduceSum(g.make<ReshapeOp>({nll, g.make<ShapeOp>({t.labels})}), {1}, false));
  }

  // Per row: how many of its labels count (its completion's tokens).
  Value rowLabelCount(GradBuilder &g, const sd::TokenScores &t) {
    OpBuilder &b = g.builder();
    Value ignored = g.make<EqualOp>({t.nextLabels, g.scalar(b.getI64Type(), double(sd::kIgnoreIndex))});
    Value counted = g.castTo(g.make<NotOp>({ignored}), b.getF32Type());
    return g.reduceSum(g.make<ReshapeOp>({counted, g.make<ShapeOp>({t.labels})}), {1}, false);
  }

  // [2P] values of interleaved rows -> (chosen [P], rejected [P]).
  std::pair<Value, Value> split(GradBuilder &g, Value rows) {
    Value pairs = g.reshape(rows, {-1, 2});
    return {g.reshape(g.sliceAxis(pairs, 1, 0, 1), {-1}), g.reshape(g.sliceAxis(pairs, 1, 1, 2), {-1})};
  }

  LogicalResult appendPreferenceLoss(func::FuncOp f) {
    FailureOr<sd::TokenScores> scores = sd::tokenScores(f, logitsOutput, tokenInput, "--recipe dpo");
    if (failed(scores))
      return failure();
    FailureOr<Value> refLogits = referenceForward(f, scores->logits);
    if (failed(refLogits))
      return failure();
    OpBuilder b(f.getBody().front().getTerminator());
    GradBuilder g(b, NameLoc::get(b.getStringAttr("dpo_loss")));
    Type f32 = b.getF32Type();
    // Each row's log-ratio log pi(y|x) - log pi_ref(y|x).
    Value logRatio = g.sub(rowLogProb(g, scores->logits, *scores), rowLogProb(g, *refLogits, *scores));
    auto [chosen, rejected] = split(g, logRatio);
    auto [chosenCount, rejectedCount] = split(g, rowLabelCount(g, *scores));
    Value perPair;
    if (lossType == "ipo") { // (h / |y_w| - h / |y_l| - 1 / (2 beta))^2, lengths at least 1 as TRL's
      Value one = g.scalar(f32, 1.0);
      Value delta =
          g.sub(g.div(chosen, g.make<MaxOp>({chosenCount, one})), g.div(rejected, g.make<MaxOp>({rejectedCount, one})));
      Value off = g.sub(delta, g.scalar(f32, 1.0 / (2.0 * beta)));
      perPair = g.mul(off, off);
    } else {
      Value margin = g.scale(g.sub(chosen, rejected), beta);
      perPair = lossType == "hinge" ? g.make<ReluOp>({g.sub(g.scalar(f32, 1.0), margin)})
                                    : g.make<SoftplusOp>({g.neg(margin)}); // -log sigmoid(beta * margin)
    }
    // A pair counts when its chosen row has a completion token (a batch's filler rows have none).
    Value counted = g.castTo(g.make<GreaterOp>({chosenCount, g.scalar(f32, 0.0)}), f32);
    Value loss = g.reduceSum(g.mul(perPair, counted), {0}, false);
    Value pairs = g.reduceSum(counted, {0}, false);
    if (g.failed())
      return failure();
    return sd::finishLossEntry(f, loss, pairs);
  }
};

} // namespace
