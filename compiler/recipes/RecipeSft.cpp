// sd-recipe-sft: the supervised fine-tuning loss, appended as sd ops to a
// clone of the model's forward (so autodiff differentiates it like the rest).
#include "sd/format/training_abi.h"
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

std::string outputName(func::FuncOp f, unsigned i) {
  auto names = f->getAttrOfType<ArrayAttr>("sd.output_names");
  return names && i < names.size() ? cast<StringAttr>(names[i]).str() : "output" + std::to_string(i);
}

std::string argName(func::FuncOp f, unsigned i) {
  auto name = f.getArgAttrOfType<StringAttr>(i, "sd.name");
  return name ? name.str() : "input" + std::to_string(i);
}

bool isTokenShaped(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getRank() == 2 && t.getElementType().isInteger(64);
}

// Indexes an embedding table: the indices of a Gather, directly or through
// a cast or reshape (nanoGPT-style and Hugging Face exports both do this).
bool feedsEmbedding(Value v, int depth = 0) {
  for (OpOperand &use : v.getUses()) {
    Operation *user = use.getOwner();
    if (isa<GatherOp>(user) && use.getOperandNumber() == 1) return true;
    if (depth < 3 && isa<CastOp, ReshapeOp, FlattenOp, SqueezeOp, UnsqueezeOp>(user) && user->getNumResults() == 1 &&
        feedsEmbedding(user->getResult(0), depth + 1))
      return true;
  }
  return false;
}

struct RecipeSftPass : sd::impl::RecipeSftBase<RecipeSftPass> {
  using RecipeSftBase::RecipeSftBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    func::FuncOp infer;
    for (auto f : module.getOps<func::FuncOp>())
      if (sd::isEntry(f) && f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kInfer) infer = f;
    if (!infer) {
      module.emitError("the model has no infer entry to build a training recipe on");
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
      if (outputName(f, i) != lossOutput) continue;
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
    int logitsIndex = -1;
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      auto t = dyn_cast<RankedTensorType>(ret.getOperand(i).getType());
      bool isFloat3d = t && t.getRank() == 3 && isa<FloatType>(t.getElementType());
      if (!logitsOutput.empty() ? outputName(f, i) == logitsOutput : isFloat3d) {
        if (logitsIndex >= 0)
          return f.emitError("the model has several [batch, seq, vocab] float outputs; name one with --logits-output");
        logitsIndex = int(i);
      }
    }
    if (logitsIndex < 0)
      return f.emitError() << (logitsOutput.empty() ? std::string("the model has no [batch, seq, vocab] logits output")
                                                    : "--logits-output '" + logitsOutput + "' is not an output");
    Value logits = ret.getOperand(unsigned(logitsIndex));
    auto lt = cast<RankedTensorType>(logits.getType());
    if (lt.getRank() != 3 || ShapedType::isDynamic(lt.getDimSize(2)))
      return f.emitError() << "logits must be [batch, seq, vocab] with a static vocabulary, got " << lt;
    FailureOr<unsigned> found = findTokenInput(f);
    if (failed(found)) return failure();
    unsigned tokenArg = *found;
    auto tokenType = cast<RankedTensorType>(f.getArgument(tokenArg).getType());
    // sdrun train feeds the data's token ids to this input, whatever it is called.
    f->getParentOfType<ModuleOp>()->setAttr("sd.token_input", StringAttr::get(f.getContext(), argName(f, tokenArg)));
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

  // The token input the labels mirror: --token-input when given, else the
  // only int64 [batch, seq] input, else the only one that indexes an embedding.
  FailureOr<unsigned> findTokenInput(func::FuncOp f) {
    SmallVector<unsigned> candidates, embedding;
    std::string names;
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      if (!tokenInput.empty()) {
        if (argName(f, i) != tokenInput) continue;
        if (!isTokenShaped(f.getArgument(i)))
          return f.emitError() << "--token-input '" << tokenInput << "' must be an int64 [batch, seq] input, it is "
                               << f.getArgument(i).getType();
        return i;
      }
      if (!isTokenShaped(f.getArgument(i))) continue;
      candidates.push_back(i);
      names += (names.empty() ? "'" : ", '") + argName(f, i) + "'";
      if (feedsEmbedding(f.getArgument(i))) embedding.push_back(i);
    }
    if (!tokenInput.empty()) return f.emitError() << "--token-input '" << tokenInput << "' is not a model input";
    if (candidates.size() == 1) return candidates[0];
    if (embedding.size() == 1) return embedding[0];
    if (candidates.empty()) return f.emitError("--recipe sft needs an int64 [batch, seq] token input");
    return f.emitError() << "cannot tell the token input among the int64 [batch, seq] inputs " << names
                         << "; name it with --token-input NAME";
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
