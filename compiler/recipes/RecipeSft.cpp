// sd-recipe-sft: the supervised fine-tuning loss, appended as sd ops to a
// clone of the model's forward (so autodiff differentiates it like the rest).
#include "sd/format/training_abi.h"
#include "EntryInputs.h"
#include "PassDetail.h"
#include "Passes.h"
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

constexpr int64_t kIgnoreIndex = -100;

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
      return finish(f, ret, loss, g.scalar(b.getF32Type(), 1.0), g);
    }
    return f.emitError() << "--loss-output '" << lossOutput << "' is not an output of the model";
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
    SmallVector<NamedAttribute> argAttrs = {
        NamedAttribute(StringAttr::get(f.getContext(), "sd.name"), StringAttr::get(f.getContext(), sd::abi::kLabels))};
    if (auto params = f.getArgAttr(tokenArg, "sd.dim_params"))
      argAttrs.push_back(NamedAttribute(StringAttr::get(f.getContext(), "sd.dim_params"), params));
    unsigned labelsIndex = f.getNumArguments();
    f.insertArgument(labelsIndex, tokenType, DictionaryAttr::get(f.getContext(), argAttrs), f.getLoc());
    Value labels = f.getArgument(labelsIndex);

    OpBuilder b(ret);
    GradBuilder g(b, NameLoc::get(b.getStringAttr("sft_loss")));
    // Position t predicts token t+1: labels shift left, the last position is ignored.
    Value shifted = g.make<SliceOp>({labels, g.ints({1}), g.ints({std::numeric_limits<int64_t>::max()}), g.ints({1}),
                                     g.none()});
    Value ignore = g.scalar(b.getI64Type(), double(kIgnoreIndex));
    Value padded = g.make<PadOp>({shifted, g.ints({0, 0, 0, 1}), ignore, g.none()});
    Value flatLabels = g.reshape(padded, {-1});
    Value scores = g.reshape(logits, {-1, lt.getDimSize(2)});
    Value loss = g.make<SoftmaxCrossEntropyLossOp>(
        {scores, flatLabels, g.none()},
        {b.getNamedAttr("reduction", b.getStringAttr("sum")), g.attr("ignore_index", kIgnoreIndex)});
    Value counted = g.make<NotOp>({g.make<EqualOp>({flatLabels, ignore})});
    Value tokens = g.make<ReduceSumOp>({g.make<CastOp>({counted}, {g.attr("to", int64_t(sd::DType::F32))}), g.none()},
                                       {g.attr("keepdims", 0)});
    if (g.failed()) return failure();
    if (lt.getElementType() != b.getF32Type())
      loss = g.make<CastOp>({loss}, {g.attr("to", int64_t(sd::DType::F32))});
    return finish(f, ret, loss, tokens, g);
  }

  LogicalResult finish(func::FuncOp f, func::ReturnOp ret, Value loss, Value tokens, GradBuilder &g) {
    if (g.failed()) return failure();
    OpBuilder b(ret);
    b.create<func::ReturnOp>(ret.getLoc(), ValueRange{loss, tokens});
    ret.erase();
    f.setType(FunctionType::get(f.getContext(), f.getArgumentTypes(), {loss.getType(), tokens.getType()}));
    f->setAttr("sd.output_names", b.getStrArrayAttr({sd::abi::kLossSum, sd::abi::kTokens}));
    return success();
  }
};

} // namespace
