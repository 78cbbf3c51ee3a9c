// sd-recipe-sft: the supervised fine-tuning loss, appended as sd ops to a
// clone of the model's forward (so autodiff differentiates it like the rest).
#include "sd/format/training_abi.h"
#include "EntryInputs.h"
#include "PassDetail.h"
#include "Passes.h"
#include "RecipeLoss.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/IRMapping.h"
#include <limits>

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
    ModuleOp module = getOperation();
    func::FuncOp infer = sd::findEntry(module, sd::abi::kInfer);
    if (!infer) {
      module.emitError("the model has no infer entry to build a training recipe on");
      return signalPassFailure();
    }
    // The data gives tokens only: a Hugging Face export's attention_mask,
    // position_ids and past_key_values take what a step over whole rows
    // means, in the training entries and in the infer entry sdrun generate
    // and infer --adapter use with them.
    if (lossOutput.empty()) {
      FailureOr<unsigned> token = sd::findTokenInput(infer, tokenInput, "--recipe sft");
      if (failed(token) ||
          failed(sd::bindAuxiliaryInputs(infer, *token, /*keepPositions=*/false, "--recipe sft", /*refuseOthers=*/false)))
        return signalPassFailure();
    }
    OpBuilder b(infer);
    auto eval = cast<func::FuncOp>(b.clone(*infer));
    eval.setName(sd::abi::kEvalStep);
    eval->setAttr("sd.entry", b.getStringAttr(sd::abi::kEvalStep));
    if (failed(lossOutput.empty() ? appendCrossEntropy(eval) : useModelLoss(eval))) return signalPassFailure();
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
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    FailureOr<unsigned> logitsIndex = sd::findLogitsOutput(f, logitsOutput, "--recipe sft");
    if (failed(logitsIndex)) return failure();
    Value logits = ret.getOperand(*logitsIndex);
    auto lt = cast<RankedTensorType>(logits.getType());
    if (lt.getRank() != 3 || ShapedType::isDynamic(lt.getDimSize(2)))
      return f.emitError() << "logits must be [batch, seq, vocab] with a static vocabulary, got " << lt;
    FailureOr<unsigned> found = sd::findTokenInput(f, tokenInput, "--recipe sft");
    if (failed(found)) return failure();
    unsigned tokenArg = *found;
    auto tokenType = cast<RankedTensorType>(f.getArgument(tokenArg).getType());
    // sdrun train feeds the data's token ids to this input, whatever it is called.
    f->getParentOfType<ModuleOp>()->setAttr("sd.token_input", StringAttr::get(f.getContext(), sd::argName(f, tokenArg)));
    Value labels = sd::addLabelsInput(f, tokenArg, tokenType.getRank(), sd::abi::kLabels);

    OpBuilder b(ret);
    GradBuilder g(b, NameLoc::get(b.getStringAttr("sft_loss")));
    // Position t predicts token t+1: labels shift left, the last position is ignored.
    Value shifted = g.make<SliceOp>({labels, g.ints({1}), g.ints({std::numeric_limits<int64_t>::max()}), g.ints({1}),
                                     g.none()});
    Value ignore = g.scalar(b.getI64Type(), double(kIgnoreIndex));
    Value padded = g.make<PadOp>({shifted, g.ints({0, 0, 0, 1}), ignore, g.none()});
    Value flatLabels = g.reshape(padded, {-1});
    Value scores = g.reshape(logits, {-1, lt.getDimSize(2)});
    sd::SummedLoss loss = sd::summedCrossEntropy(g, scores, flatLabels);
    if (g.failed() || !loss.loss) return failure();
    return sd::finishLossEntry(f, loss.loss, loss.count);
  }
};

} // namespace
