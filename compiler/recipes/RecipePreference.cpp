// sd-recipe-preference: preference optimization on (chosen, rejected)
// completion pairs, appended as sd ops to a clone of the model's forward so
// autodiff differentiates it like any other loss. Three methods, each as its
// TRL trainer computes it:
//   dpo    DPOTrainer: DPO's sigmoid loss (Rafailov et al. 2023), IPO's
//          squared loss on per-token log-ratios, or the hinge, against a
//          reference model;
//   simpo  CPOTrainer with loss_type "simpo" (Meng et al. 2024): the
//          per-token log-probabilities' margin less gamma, no reference, plus
//          cpo_alpha times the chosen rows' cross-entropy;
//   orpo   ORPOTrainer (Hong et al. 2024): the chosen rows' cross-entropy
//          less beta times log sigmoid of the log odds ratio, no reference;
//   kto    KTOTrainer (Ethayarajh et al. 2024): unpaired examples, each
//          desirable or not, their log-ratios against the reference measured
//          from the batch's KL estimate.
//
// Rows come in pairs: row 2i holds pair i's chosen completion, row 2i+1 its
// rejected one. Interleaved rather than TRL's [chosen; rejected] halves, so
// that a data-parallel split of a batch's rows never splits a pair. KTO's
// row 2i is example i (prompt and completion), row 2i+1 example i's prompt
// with the completion of the micro-batch's example before it (TRL's KL
// sequences: the completions rotated by one), and the `desirable` input
// gives each row its example's label.
//
// DPO's reference model is the model as training starts. The forward is
// cloned once more, with every trainable parameter read from a
// `reference/<name>` copy (scalar state: checkpointed with the run, never
// optimized, outside the gradient). Adapters start as the identity (LoRA's
// zero B, IA3's ones), so with PEFT that is the base model, TRL's reference
// with adapters disabled; in full fine-tuning it is the initial weights,
// TRL's ref_model; a run that starts from an adapter (sdrun train --adapter,
// which refreshes the copies) measures against that adapter's model, as
// TRL's "ref" adapter does. Only ops that depend on a trainable parameter are
// cloned; the rest of the forward (the embedding lookup, layers before the
// first adapter) is shared.
#include "sd/format/training_abi.h"
#include "EntryInputs.h"
#include "PassDetail.h"
#include "Passes.h"
#include "RecipeLoss.h"
#include "vjp/GradBuilder.h"

namespace sd {
#define GEN_PASS_DEF_RECIPEPREFERENCE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct RecipePreferencePass : sd::impl::RecipePreferenceBase<RecipePreferencePass> {
  using RecipePreferenceBase::RecipePreferenceBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (method != "dpo" && method != "simpo" && method != "orpo" && method != "kto") {
      module.emitError() << "the preference method is 'dpo', 'simpo', 'orpo' or 'kto', not '" << method << "'";
      return signalPassFailure();
    }
    if (!(desirableWeight >= 0) || !(undesirableWeight >= 0)) {
      module.emitError() << "--desirable-weight and --undesirable-weight must not be negative";
      return signalPassFailure();
    }
    if (!(beta > 0)) {
      module.emitError() << "--beta must be positive, got " << beta;
      return signalPassFailure();
    }
    if (lossType != "sigmoid" && lossType != "ipo" && lossType != "hinge") {
      module.emitError() << "--dpo-loss takes 'sigmoid', 'ipo' or 'hinge', got '" << lossType << "'";
      return signalPassFailure();
    }
    who = "--recipe " + method;
    func::FuncOp eval = sd::cloneInferAsEvalStep(module, tokenInput, who, /*bindInputs=*/true);
    if (!eval || failed(appendPreferenceLoss(eval))) return signalPassFailure();
  }

  std::string who; // "--recipe dpo", for errors

  // Per row: the summed log-probability of its counted labels (`next`,
  // flattened [batch * seq], as each position is scored against).
  Value rowLogProb(GradBuilder &g, Value logits, Value next, Value rowsLike) {
    return g.reduceSum(sd::tokenLogProbs(g, logits, next, rowsLike), {1}, false);
  }

  // Per row: how many of its labels count (its completion's tokens).
  Value rowLabelCount(GradBuilder &g, Value next, Value rowsLike) {
    return g.reduceSum(g.make<ReshapeOp>({sd::countedLabels(g, next), g.make<ShapeOp>({rowsLike})}), {1}, false);
  }

  // [2P] values of interleaved rows -> (chosen [P], rejected [P]).
  std::pair<Value, Value> split(GradBuilder &g, Value rows) {
    Value pairs = g.reshape(rows, {-1, 2});
    return {g.reshape(g.sliceAxis(pairs, 1, 0, 1), {-1}), g.reshape(g.sliceAxis(pairs, 1, 1, 2), {-1})};
  }

  // DPO's loss per pair from the rows' log-ratios against the reference.
  Value dpoLoss(GradBuilder &g, Value logRatio, Value count) {
    Type f32 = g.builder().getF32Type();
    auto [chosen, rejected] = split(g, logRatio);
    if (lossType == "ipo") { // (h / |y_w| - h / |y_l| - 1 / (2 beta))^2, lengths at least 1 as TRL's
      auto [chosenCount, rejectedCount] = split(g, g.make<MaxOp>({count, g.scalar(f32, 1.0)}));
      Value delta = g.sub(g.div(chosen, chosenCount), g.div(rejected, rejectedCount));
      Value off = g.sub(delta, g.scalar(f32, 1.0 / (2.0 * beta)));
      return g.mul(off, off);
    }
    Value margin = g.scale(g.sub(chosen, rejected), beta);
    return lossType == "hinge" ? g.make<ReluOp>({g.sub(g.scalar(f32, 1.0), margin)})
                               : g.make<SoftplusOp>({g.neg(margin)}); // -log sigmoid(beta * margin)
  }

  // log(1 - exp(x)) for x < 0 (ORPO's log(1 - p)).
  Value log1mexp(GradBuilder &g, Value x) {
    return g.make<LogOp>({g.sub(g.scalar(g.builder().getF32Type(), 1.0), g.make<ExpOp>({x}))});
  }

  // The reference-free methods' loss per pair from the rows' mean
  // log-probability per completion token.
  Value referenceFreeLoss(GradBuilder &g, Value meanLogProb) {
    auto [chosen, rejected] = split(g, meanLogProb);
    if (method == "simpo") // -log sigmoid(beta * (chosen - rejected) - gamma)
      return g.make<SoftplusOp>({g.neg(g.sub(g.scale(g.sub(chosen, rejected), beta),
                                             g.scalar(g.builder().getF32Type(), simpoGamma)))});
    // ORPO: -beta * log sigmoid(log odds(chosen) - log odds(rejected)), odds p / (1 - p).
    Value logOdds = g.sub(g.sub(chosen, rejected), g.sub(log1mexp(g, chosen), log1mexp(g, rejected)));
    return g.scale(g.make<SoftplusOp>({g.neg(logOdds)}), beta);
  }

  // KTO over examples (row 2i) and their KL rows (2i + 1), from each row's
  // log-ratio against the reference and its completion's token count.
  LogicalResult appendKtoLoss(func::FuncOp f, GradBuilder &g, Value logRatio, Value count) {
    OpBuilder &b = g.builder();
    Type f32 = b.getF32Type();
    Value desirableRows = sd::addLabelsInput(f, f.getNumArguments() - 1, 1, sd::abi::kDesirable);
    auto [ratio, klRatio] = split(g, logRatio);
    // An example counts when it has a completion token (a batch's filler rows have none).
    Value counted = g.castTo(g.make<GreaterOp>({split(g, count).first, g.scalar(f32, 0.0)}), f32);
    Value examples = g.reduceSum(counted, {0}, false);
    // TRL's KL estimate: the KL rows' mean log-ratio over the micro-batch,
    // clamped at 0 and detached (a baseline, not a path for gradients).
    Value klMean = g.div(g.reduceSum(g.mul(klRatio, counted), {0}, false), g.make<MaxOp>({examples, g.scalar(f32, 1.0)}));
    Value kl = g.make<MaxOp>({klMean, g.scalar(f32, 0.0)});
    if (g.failed()) return failure();
    kl.getDefiningOp()->setAttr(sd::kDetachedAttr, b.getUnitAttr());
    // z = beta (log-ratio - KL): desirable 1 - sigmoid(z), undesirable 1 - sigmoid(-z).
    Value z = g.scale(g.sub(ratio, kl), beta);
    Value desirable = g.make<EqualOp>({split(g, desirableRows).first, g.scalar(b.getI64Type(), 1.0)});
    Value perExample = g.make<WhereOp>({desirable, g.scale(g.make<SigmoidOp>({g.neg(z)}), desirableWeight),
                                        g.scale(g.make<SigmoidOp>({z}), undesirableWeight)});
    Value loss = g.reduceSum(g.mul(perExample, counted), {0}, false);
    if (g.failed()) return failure();
    return sd::finishLossEntry(f, loss, examples);
  }

  LogicalResult appendPreferenceLoss(func::FuncOp f) {
    FailureOr<sd::TokenScores> scores = sd::tokenScores(f, logitsOutput, tokenInput, who);
    if (failed(scores)) return failure();
    // --shapes cannot change a dimension the export fixed, so an odd fixed batch is final.
    int64_t rows = cast<RankedTensorType>(scores->tokens.getType()).getDimSize(0);
    if (!ShapedType::isDynamic(rows) && rows % 2)
      return f.emitError() << who << ": the model fixes its batch at " << rows
                           << " rows, but a preference plan's rows are (chosen, rejected) pairs: export the model "
                              "with an even or a dynamic batch";
    FailureOr<Value> refLogits = Value();
    if ((method == "dpo" || method == "kto") && failed(refLogits = sd::referenceForward(f, scores->logits, who))) return failure();
    OpBuilder b(f.getBody().front().getTerminator());
    GradBuilder g(b, NameLoc::get(b.getStringAttr(method + "_loss")));
    Type f32 = b.getF32Type();
    const sd::TokenScores &t = *scores;
    Value logProb = rowLogProb(g, t.logits, t.nextLabels, t.labels), count = rowLabelCount(g, t.nextLabels, t.labels);
    if (method == "kto") {
      Value logRatio = g.sub(logProb, rowLogProb(g, *refLogits, t.nextLabels, t.labels));
      return appendKtoLoss(f, g, logRatio, count);
    }
    Value perPair;
    if (method == "dpo") {
      perPair = dpoLoss(g, g.sub(logProb, rowLogProb(g, *refLogits, t.nextLabels, t.labels)), count);
    } else {
      // A filler row (no completion) gets a harmless -1, not 0 / 0: ORPO's
      // log(1 - p) would be -inf there, and its gradient NaN even when masked.
      Value hasTokens = g.make<GreaterOp>({count, g.scalar(f32, 0.0)});
      Value mean = g.div(logProb, g.make<MaxOp>({count, g.scalar(f32, 1.0)}));
      perPair = referenceFreeLoss(g, g.make<WhereOp>({hasTokens, mean, g.scalar(f32, -1.0)}));
    }
    // A pair counts when its chosen row has a completion token (a batch's filler rows have none).
    Value chosenCount = split(g, count).first;
    Value counted = g.castTo(g.make<GreaterOp>({chosenCount, g.scalar(f32, 0.0)}), f32);
    Value pairs = g.reduceSum(counted, {0}, false);
    Value loss = g.reduceSum(g.mul(perPair, counted), {0}, false);
    // SimPO's cpo_alpha and ORPO's weight 1 on the chosen rows' cross-entropy,
    // a mean over the micro-batch's chosen tokens as TRL's is, counted once
    // per pair. SimPO's covers the completion; ORPO's, as TRL's ORPOTrainer,
    // every token after the first (prompt included): its labels are the
    // tokens themselves where a new attention_mask input marks them.
    double nllWeight = method == "simpo" ? cpoAlpha : method == "orpo" ? 1.0 : 0.0;
    if (nllWeight != 0) {
      Value nllLogProb = logProb, nllCount = count;
      if (method == "orpo") {
        Value mask = sd::addLabelsInput(f, f.getNumArguments() - 1, 2, sd::abi::kAttentionMask);
        Value isToken = g.make<EqualOp>({mask, g.scalar(b.getI64Type(), 1.0)});
        Value next = sd::nextTokenLabels(g, g.make<WhereOp>({isToken, t.tokens, g.scalar(b.getI64Type(),
                                                                                          double(sd::kIgnoreIndex))}));
        nllLogProb = rowLogProb(g, t.logits, next, t.labels);
        nllCount = rowLabelCount(g, next, t.labels);
      }
      Value chosenNll = g.neg(g.reduceSum(split(g, nllLogProb).first, {0}, false));
      Value chosenTokens = g.make<MaxOp>({g.reduceSum(split(g, nllCount).first, {0}, false), g.scalar(f32, 1.0)});
      loss = g.add(loss, g.mul(pairs, g.scale(g.div(chosenNll, chosenTokens), nllWeight)));
    }
    if (g.failed()) return failure();
    return sd::finishLossEntry(f, loss, pairs);
  }
};

} // namespace
