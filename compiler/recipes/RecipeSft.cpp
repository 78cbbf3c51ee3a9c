// sd-recipe-sft: the supervised fine-tuning loss, appended as sd ops to a
// clone of the model's forward (so autodiff differentiates it like the rest).
#include "EntryInputs.h"
#include "PassDetail.h"
#include "Passes.h"
#include "RecipeLoss.h"
#include "sd/format/training_abi.h"
#include "vjp/GradBuilder.h"

namespace sd {
#define GEN_PASS_DEF_RECIPESFT
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

using sd::kIgnoreIndex;

struct RecipeSftPass : sd::impl::RecipeSftBase<RecipeSftPass> {
  using RecipeSftBase::RecipeSftBase;

  void runOnOperation() override {
    // A model with its own loss takes its inputs as they are.
    func::FuncOp eval = sd::cloneInferAsEvalStep(getOperation(), tokenInput, "--recipe sft", lossOutput.empty());
    if (!eval || failed(lossOutput.empty() ? appendCrossEntropy(eval) : useModelLoss(eval)))
      return signalPassFailure();
  }

  // The model computes its own loss: that output, one "token" per micro-batch.
  LogicalResult useModelLoss(func::FuncOp f) {
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      if (sd::outputName(f, i) != lossOutput) continue;
      Value loss = ret.getOperand(i);
      auto t = dyn_cast<RankedTensorType>(loss.getType());
      if (!t || !isa<FloatType>(t.getElementType()) || (t.hasStaticShape() && t.getNumElements() != 1))
        return f.emitError() << "--loss-output '" << lossOutput << "' must be a float scalar, it is " << loss.getType();
      OpBuilder b(ret);
      GradBuilder g(b, ret.getLoc());
      if (t.getRank() != 0) loss = g.reshape(loss, {});
      Value one = g.scalar(b.getF32Type(), 1.0);
      if (g.failed()) return failure();
      return sd::finishLossEntry(f, loss, one);
    }
    return f.emitError() << "--loss-output '" << lossOutput << "' is not an output of the model" << sd::outputNamesNote(f);
  }

  LogicalResult appendCrossEntropy(func::FuncOp f) {
    FailureOr<sd::TokenScores> scores = sd::tokenScores(f, logitsOutput, tokenInput, "--recipe sft");
    if (failed(scores))
      return failure();
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    OpBuilder b(ret);
    GradBuilder g(b, NameLoc::get(b.getStringAttr("sft_loss")));
    int64_t vocab = cast<RankedTensorType>(scores->logits.getType()).getDimSize(2);
    sd::SummedLoss loss = sd::summedCrossEntropy(g, g.reshape(scores->logits, {-1, vocab}), scores->nextLabels);
    if (g.failed() || !loss.loss)
      return failure();
    return sd::finishLossEntry(f, loss.loss, loss.count);
  }
};

} // namespace
