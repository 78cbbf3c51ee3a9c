// sd-recipe-classify: sequence classification on an encoder. A new linear
// head (PEFT's modules_to_save "classifier", trained in full) maps the
// model's pooled features to class logits; the loss is cross-entropy against
// one label per row. BertForSequenceClassification's head on a sentence
// encoder's pooling, as sentence-transformers' users fine-tune it.
#include "sd/format/training_abi.h"
#include "EntryInputs.h"
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "RecipeLoss.h"
#include "vjp/GradBuilder.h"
#include <cmath>
#include <random>

namespace sd {
#define GEN_PASS_DEF_RECIPECLASSIFY
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

constexpr const char *kWho = "--recipe classify";

struct RecipeClassifyPass : sd::impl::RecipeClassifyBase<RecipeClassifyPass> {
  using RecipeClassifyBase::RecipeClassifyBase;

  void runOnOperation() override {
    if (failed(build())) signalPassFailure();
  }

  LogicalResult build() {
    ModuleOp module = getOperation();
    func::FuncOp infer = sd::findEntry(module, sd::abi::kInfer);
    if (!infer) return module.emitError("the model has no infer entry to build a training recipe on");
    if (numLabels < 2) return module.emitError() << kWho << " needs --num-labels N with N >= 2, got " << int64_t(numLabels);
    if (pooling != "mean" && pooling != "cls")
      return module.emitError() << "--pooling takes 'mean' or 'cls', got '" << pooling << "'";
    for (const char *taken : {sd::abi::kClassifierWeight, sd::abi::kClassifierBias})
      if (module.lookupSymbol(taken))
        return module.emitError() << kWho << ": the model already has a weight named '" << taken
                                  << "'; export the encoder without its classification head";
    FailureOr<unsigned> token = sd::findTokenInput(infer, tokenInput, kWho);
    if (failed(token)) return failure();
    FailureOr<int64_t> vocab = embeddingRows(infer, *token);
    if (failed(vocab)) return failure();
    std::string tokenName = sd::argName(infer, *token);
    // Rows are padded to the bucket's length, so the attention mask stays an
    // input the trainer fills; positions and segments take their defaults.
    if (failed(sd::bindAuxiliaryInputs(infer, *token, /*keepPositions=*/false, kWho, /*refuseOthers=*/true,
                                       /*keepMask=*/true)))
      return failure();
    token = sd::findTokenInput(infer, tokenName, kWho); // the bound inputs are gone
    if (failed(token) || failed(appendHead(module, infer))) return failure();

    OpBuilder b(infer);
    auto eval = cast<func::FuncOp>(b.clone(*infer));
    eval.setName(sd::abi::kEvalStep);
    eval->setAttr("sd.entry", b.getStringAttr(sd::abi::kEvalStep));
    Value labels = sd::addLabelsInput(eval, *token, 1, sd::abi::kLabels);
    auto ret = cast<func::ReturnOp>(eval.getBody().front().getTerminator());
    OpBuilder at(ret);
    GradBuilder g(at, NameLoc::get(at.getStringAttr("classify_loss")));
    sd::SummedLoss loss = sd::summedCrossEntropy(g, ret.getOperand(0), labels);
    if (!loss.loss) return eval.emitError("cannot build the classification loss");
    if (failed(sd::finishLossEntry(eval, loss.loss, loss.count))) return failure();

    module->setAttr("sd.token_input", b.getStringAttr(tokenName));
    module->setAttr("sd.classify", b.getDictionaryAttr({b.getNamedAttr("num_labels", b.getI64IntegerAttr(numLabels)),
                                                        b.getNamedAttr("vocab", b.getI64IntegerAttr(*vocab)),
                                                        b.getNamedAttr("pooling", b.getStringAttr(pooling))}));
    return success();
  }

  // The rows of the embedding table the token input indexes: the token ids
  // the data may hold.
  static FailureOr<int64_t> embeddingRows(func::FuncOp f, unsigned token) {
    if (Operation *gather = sd::embeddingLookupOf(f.getArgument(token))) {
      auto t = dyn_cast<RankedTensorType>(gather->getOperand(0).getType());
      if (t && t.getRank() == 2 && !t.isDynamicDim(0)) return t.getDimSize(0);
    }
    return f.emitError() << kWho << ": cannot find the embedding table that '" << sd::argName(f, token)
                         << "' indexes, so token ids cannot be checked against a vocabulary";
  }

  // The features output: --features-output, else the only float output of
  // rank 2 ([batch, hidden], already pooled) or 3 ([batch, seq, hidden]).
  FailureOr<unsigned> featuresIndex(func::FuncOp f) {
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    std::vector<unsigned> candidates;
    std::string names;
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      auto t = dyn_cast<RankedTensorType>(ret.getOperand(i).getType());
      bool usable = t && isa<FloatType>(t.getElementType()) && (t.getRank() == 2 || t.getRank() == 3);
      if (!featuresOutput.empty()) {
        if (sd::outputName(f, i) != featuresOutput) continue;
        if (!usable)
          return f.emitError() << "--features-output '" << featuresOutput << "' must be a float [batch, hidden] or "
                               << "[batch, seq, hidden] output, it is " << ret.getOperand(i).getType();
        return i;
      }
      if (!usable) continue;
      candidates.push_back(i);
      names += (names.empty() ? "'" : ", '") + sd::outputName(f, i) + "'";
    }
    if (!featuresOutput.empty())
      return f.emitError() << "--features-output '" << featuresOutput << "' is not an output of the model"
                           << sd::outputNamesNote(f);
    if (candidates.size() == 1) return candidates[0];
    if (candidates.empty()) return f.emitError() << kWho << ": the model has no float [batch, hidden] or [batch, seq, hidden] output";
    return f.emitError() << kWho << ": the model has several feature outputs (" << names << "); pick one with --features-output";
  }

  // [batch, seq, hidden] -> [batch, hidden]: the first token (cls), or the
  // mean over the tokens attention_mask keeps (sentence-transformers' rule,
  // the count clamped at 1e-9), or over all when there is no mask.
  Value pool(GradBuilder &g, func::FuncOp f, Value hidden) {
    int64_t h = cast<RankedTensorType>(hidden.getType()).getDimSize(2);
    OpBuilder &b = g.builder();
    if (pooling == "cls")
      return g.reshape(g.make<SliceOp>({hidden, g.ints({0}), g.ints({1}), g.ints({1}), g.none()}), {-1, h});
    Value mask;
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      if (sd::argName(f, i) == "attention_mask") mask = f.getArgument(i);
    if (!mask) return g.make<ReduceMeanOp>({hidden, g.ints({1})}, {g.attr("keepdims", 0)});
    Value m = g.make<UnsqueezeOp>({g.make<CastOp>({mask}, {g.attr("to", int64_t(sd::DType::F32))}), g.ints({2})});
    Value sum = g.reduceSum(g.mul(hidden, m), {1}, false);
    Value count = g.make<MaxOp>({g.reduceSum(m, {1}, false), g.scalar(b.getF32Type(), 1e-9)});
    return g.div(sum, count);
  }

  // infer's outputs become the head's logits [batch, num_labels].
  LogicalResult appendHead(ModuleOp module, func::FuncOp f) {
    FailureOr<unsigned> index = featuresIndex(f);
    if (failed(index)) return failure();
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    Value features = ret.getOperand(*index);
    auto t = cast<RankedTensorType>(features.getType());
    if (!t.getElementType().isF32()) return f.emitError() << kWho << ": the features must be f32, they are " << t;
    int64_t hidden = t.getDimSize(t.getRank() - 1);
    if (ShapedType::isDynamic(hidden)) return f.emitError() << kWho << ": the features' hidden size is not known: " << t;
    // nn.Linear's initialization: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
    std::mt19937_64 rng{static_cast<uint64_t>(seed) ^ 0xC1A551F1E5ull};
    double bound = 1.0 / std::sqrt(double(hidden));
    std::vector<float> w = sd::uniformFloats(size_t(numLabels * hidden), bound, rng),
                       bias = sd::uniformFloats(size_t(numLabels), bound, rng);
    GlobalOp gw = sd::createFloatGlobal(module, sd::abi::kClassifierWeight, {numLabels, hidden}, "trainable", &w);
    GlobalOp gb = sd::createFloatGlobal(module, sd::abi::kClassifierBias, {numLabels}, "trainable", &bias);
    OpBuilder b(ret);
    GradBuilder g(b, NameLoc::get(b.getStringAttr(sd::abi::kClassifierModule)));
    Value pooled = t.getRank() == 3 ? pool(g, f, features) : features;
    Value logits = g.make<LinearOp>({pooled, b.create<GlobalLoadOp>(ret.getLoc(), gw.getType(), gw.getSymName()),
                                     b.create<GlobalLoadOp>(ret.getLoc(), gb.getType(), gb.getSymName())},
                                    {b.getNamedAttr("layout", b.getStringAttr("oi")),
                                     b.getNamedAttr("module", b.getStringAttr(sd::abi::kClassifierModule))});
    if (g.failed()) return f.emitError() << kWho << ": cannot build the head on the features " << t;
    sd::setEntryOutputs(f, {logits}, {"logits"});
    return success();
  }
};

} // namespace
