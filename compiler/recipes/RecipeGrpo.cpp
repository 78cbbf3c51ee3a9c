// sd-recipe-grpo: GRPO (Shao et al. 2024, DeepSeekMath) and the variants
// TRL's GRPOTrainer offers through its loss_type (DAPO, Dr. GRPO, BNPO,
// CISPO, SAPO, LUSPO, VESPO) and importance_sampling_level (GSPO), appended as sd ops to a clone of the
// model's forward so autodiff differentiates it like any other loss.
//
// Rows come in groups: rows [kG, (k+1)G) hold G completions of prompt k,
// each with its reward in the `rewards` input. The data parallel split and
// gradient accumulation keep groups whole (sdrun train fills a micro-batch
// with whole groups), so the advantages, which compare a group's
// completions, are computed here from the rewards, as TRL computes them
// after scoring.
//
// What TRL's loss needs beyond the step's own forward is the policy that
// sampled the completions (old_per_token_logps). With TRL's default
// num_iterations 1 that is this step's policy, detached: the importance
// weight is 1 and its gradient the log-probability's. The plan computes it
// so (a detached copy of the log-probabilities), which keeps TRL's clipping
// and bias-corrected KL term exact in value and in gradient.
#include "sd/format/training_abi.h"
#include "EntryInputs.h"
#include "PassDetail.h"
#include "Passes.h"
#include "RecipeLoss.h"
#include "vjp/GradBuilder.h"

namespace sd {
#define GEN_PASS_DEF_RECIPEGRPO
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct RecipeGrpoPass : sd::impl::RecipeGrpoBase<RecipeGrpoPass> {
  using RecipeGrpoBase::RecipeGrpoBase;

  const char *who = "--recipe grpo";

  LogicalResult checkOptions() {
    ModuleOp module = getOperation();
    auto bad = [&]() { return module.emitError() << who << ": "; };
    if (numGenerations < 2 || numGenerations > 4096)
      return bad() << "--num-generations must be in [2, 4096] (a group's advantages compare its completions), got "
                   << int64_t(numGenerations);
    if (lossType != "dapo" && lossType != "grpo" && lossType != "bnpo" && lossType != "dr_grpo" &&
        lossType != "cispo" && lossType != "sapo" && lossType != "luspo" && lossType != "vespo")
      return bad() << "--grpo-loss takes 'dapo', 'grpo', 'bnpo', 'dr_grpo', 'cispo', 'sapo', 'luspo' or 'vespo', got '"
                   << lossType << "'";
    for (double v : {double(vespoKPos), double(vespoLambdaPos), double(vespoKNeg), double(vespoLambdaNeg)})
      if (!std::isfinite(v)) return bad() << "the --vespo-k-* and --vespo-lambda-* values must be finite";
    if (!(sapoTemperaturePos > 0 && sapoTemperatureNeg > 0 && std::isfinite(sapoTemperaturePos) &&
          std::isfinite(sapoTemperatureNeg)))
      return bad() << "--sapo-temperature-pos and --sapo-temperature-neg must be positive";
    if (importanceSampling != "token" && importanceSampling != "sequence")
      return bad() << "--importance-sampling takes 'token' or 'sequence', got '" << importanceSampling << "'";
    if (scaleRewards != "group" && scaleRewards != "none")
      return bad() << "--scale-rewards takes 'group' or 'none', got '" << scaleRewards
                   << "' (TRL's 'batch' takes the std over the whole generation batch, which a plan's micro-batch "
                      "does not see)";
    if (!(beta >= 0) || !std::isfinite(beta)) return bad() << "--beta must be 0 or positive, got " << beta;
    if (!(epsilon >= 0 && epsilon < 1)) return bad() << "--epsilon must be in [0, 1), got " << epsilon;
    if (!(epsilonHigh < 0 || std::isfinite(epsilonHigh)))
      return bad() << "--epsilon-high must be finite, got " << epsilonHigh;
    if (!(delta == 0 || (delta > 1 && std::isfinite(delta))))
      return bad() << "--delta must be above 1 (or 0: no two-sided clipping), got " << delta;
    if (maxCompletionLength < 1 || maxCompletionLength > (int64_t(1) << 31))
      return bad() << "--max-completion-length must be positive, got " << int64_t(maxCompletionLength);
    return success();
  }

  void runOnOperation() override {
    if (failed(checkOptions())) return signalPassFailure();
    func::FuncOp eval = sd::cloneInferAsEvalStep(getOperation(), tokenInput, who, /*bindInputs=*/true);
    if (!eval || failed(appendGrpoLoss(eval))) return signalPassFailure();
  }

  // Each row's advantage [rows, 1] from its group's rewards: reward less the
  // group's mean, over the group's std (Bessel-corrected) + 1e-4 unless
  // --scale-rewards none. In TRL's float32 operation order: a mean is a sum
  // divided by the count, the variance the mean square times count/(count-1).
  Value advantages(GradBuilder &g, Value rewards) {
    Type f32 = g.builder().getF32Type();
    const int64_t n = numGenerations;
    Value grouped = g.reshape(rewards, {-1, n});
    Value mean = g.div(g.reduceSum(grouped, {1}, true), g.scalar(f32, double(n)));
    Value centered = g.sub(grouped, mean);
    if (scaleRewards == "group") {
      Value variance = g.div(g.reduceSum(g.mul(centered, centered), {1}, true), g.scalar(f32, double(n)));
      variance = g.mul(variance, g.scalar(f32, double(float(n) / float(n - 1))));
      centered = g.div(centered, g.add(g.make<SqrtOp>({variance}), g.scalar(f32, 1e-4)));
    }
    return g.reshape(centered, {-1, 1});
  }

  // VESPO's weight per completion [rows, 1], detached: φ(w) = e^λ w^k e^{-λw}
  // (1 at w = 1) of the completion's summed log-ratio w, k and λ by the
  // advantage's sign, computed in log space with TRL's clamps; NaN and
  // infinities become 0.
  Value gammaWeights(GradBuilder &g, Value logRatio, Value mask, Value adv) {
    Type f32 = g.builder().getF32Type();
    Value clamped = g.make<ClipOp>({logRatio, g.scalar(f32, -20.0), g.scalar(f32, 20.0)});
    Value logW = g.make<ClipOp>({g.reduceSum(g.mul(clamped, mask), {1}, true), g.scalar(f32, std::log(1e-8)),
                                 g.scalar(f32, 20.0)});
    Value nonNegative = g.make<GreaterOrEqualOp>({adv, g.scalar(f32, 0.0)});
    Value k = g.make<WhereOp>({nonNegative, g.scalar(f32, vespoKPos), g.scalar(f32, vespoKNeg)});
    Value lambda = g.make<MaxOp>({g.make<WhereOp>({nonNegative, g.scalar(f32, vespoLambdaPos),
                                                   g.scalar(f32, vespoLambdaNeg)}),
                                  g.scalar(f32, 1e-4)});
    Value logPhi = g.sub(g.add(lambda, g.mul(k, logW)), g.mul(lambda, g.make<ExpOp>({logW})));
    Value phi = g.make<ExpOp>({logPhi});
    Value bad = g.make<OrOp>({g.make<IsNaNOp>({phi}), g.make<IsInfOp>({phi})});
    Value weight = g.make<WhereOp>({bad, g.scalar(f32, 0.0), phi});
    if (weight) weight.getDefiningOp()->setAttr(sd::kDetachedAttr, g.builder().getUnitAttr());
    return weight;
  }

  LogicalResult appendGrpoLoss(func::FuncOp f) {
    FailureOr<sd::TokenScores> scores = sd::tokenScores(f, logitsOutput, tokenInput, who);
    if (failed(scores)) return failure();
    const sd::TokenScores &t = *scores;
    // --shapes cannot change a dimension the export fixed, so a fixed batch that splits a group is final.
    int64_t rows = cast<RankedTensorType>(t.tokens.getType()).getDimSize(0);
    if (!ShapedType::isDynamic(rows) && rows % numGenerations)
      return f.emitError() << who << ": the model fixes its batch at " << rows << " rows, which is not a whole "
                           << "number of groups of --num-generations " << int64_t(numGenerations)
                           << " completions: export the model with a dynamic batch or pick a divisor";
    FailureOr<Value> refLogits = Value();
    if (beta > 0 && failed(refLogits = sd::referenceForward(f, t.logits, who))) return failure();
    OpBuilder b(f.getBody().front().getTerminator());
    GradBuilder g(b, NameLoc::get(b.getStringAttr("grpo_loss")));
    Type f32 = b.getF32Type();
    auto one = [&]() { return g.scalar(f32, 1.0); };
    Value rewards = sd::addLabelsInput(f, f.getNumArguments() - 1, 1, sd::abi::kRewards, f32);

    Value logProb = sd::tokenLogProbs(g, t.logits, t.nextLabels, t.labels); // [rows, seq]
    Value mask = g.make<ReshapeOp>({sd::countedLabels(g, t.nextLabels), g.make<ShapeOp>({t.labels})});
    if (g.failed()) return failure();
    // The sampling policy's log-probabilities: given, for groups an earlier
    // policy sampled (0 where a label is not counted, as logProb is), or this
    // step's, detached (a second op, so that no folding can merge it with the
    // differentiated one).
    Value oldLogProb;
    if (samplingLogProbs) {
      unsigned labelsArg = cast<BlockArgument>(t.labels).getArgNumber();
      oldLogProb = sd::addLabelsInput(f, labelsArg, 2, sd::abi::kOldLogProbs, f32);
    } else {
      Operation *old = b.clone(*logProb.getDefiningOp());
      old->setAttr(sd::kDetachedAttr, b.getUnitAttr());
      oldLogProb = old->getResult(0);
    }
    Value logRatio = g.sub(logProb, oldLogProb);
    Value tokensPerRow = g.reduceSum(mask, {1}, true); // [rows, 1]
    Value logWeight = logRatio;
    if (importanceSampling == "sequence") // GSPO: the completion's mean log-ratio
      logWeight = g.div(g.reduceSum(g.mul(logRatio, mask), {1}, true), g.make<MaxOp>({tokensPerRow, one()}));
    Value weight = g.make<ExpOp>({logWeight});
    const double high = epsilonHigh < 0 ? epsilon : epsilonHigh;
    Value clipped = g.make<ClipOp>({weight, g.scalar(f32, 1.0 - epsilon), g.scalar(f32, 1.0 + high)});
    Value capped = delta > 0 ? g.make<MinOp>({weight, g.scalar(f32, delta)}) : weight;
    Value adv = advantages(g, rewards);
    Value perToken;
    if (lossType == "cispo") { // the weight itself clipped above at epsilon_high, detached, times A log p
      Value ratio = g.make<MinOp>({weight, g.scalar(f32, high)});
      if (!ratio) return failure();
      ratio.getDefiningOp()->setAttr(sd::kDetachedAttr, b.getUnitAttr());
      perToken = g.mul(g.mul(g.neg(ratio), adv), logProb);
    } else if (lossType == "vespo") {
      perToken = g.mul(g.mul(g.neg(gammaWeights(g, logRatio, mask, adv)), adv), logProb);
    } else if (lossType == "sapo") { // a soft gate: sigmoid(t (w - 1)) 4 / t, t by the advantage's sign
      Value t = g.make<WhereOp>({g.make<GreaterOp>({adv, g.scalar(f32, 0.0)}), g.scalar(f32, sapoTemperaturePos),
                                 g.scalar(f32, sapoTemperatureNeg)});
      Value gate = g.div(g.scale(g.make<SigmoidOp>({g.mul(t, g.sub(weight, one()))}), 4.0), t);
      perToken = g.neg(g.mul(gate, adv));
    } else {
      perToken = g.neg(g.make<MinOp>({g.mul(capped, adv), g.mul(clipped, adv)}));
    }
    if (beta > 0) { // k3: exp(ref - p) - (ref - p) - 1, times the importance weight
      Value d = g.sub(sd::tokenLogProbs(g, *refLogits, t.nextLabels, t.labels), logProb);
      Value kl = g.mul(g.sub(g.sub(g.make<ExpOp>({d}), d), one()), weight);
      perToken = g.add(perToken, g.scale(kl, beta));
    }
    Value rowSums = g.reduceSum(g.mul(perToken, mask), {1}, false); // [rows]
    Value rowTokens = g.reshape(tokensPerRow, {-1});
    Value total = g.reduceSum(rowSums, {0}, false);
    Value tokens = g.reduceSum(rowTokens, {0}, false);
    // A completion counts when it has a token (a batch's filler rows have none).
    Value completions = g.reduceSum(g.castTo(g.make<GreaterOp>({rowTokens, g.scalar(f32, 0.0)}), f32), {0}, false);
    Value loss, count;
    if (lossType == "dapo" || lossType == "cispo" || lossType == "vespo") { // over the optimizer window's tokens
      loss = total, count = tokens;
    } else if (lossType == "luspo") { // each completion's token sum, averaged over completions
      loss = g.reduceSum(rowSums, {0}, false), count = completions;
    } else if (lossType == "grpo" || lossType == "sapo") { // each completion's token mean, averaged over completions
      loss = g.reduceSum(g.div(rowSums, g.make<MaxOp>({rowTokens, one()})), {0}, false), count = completions;
    } else if (lossType == "bnpo") { // the micro-batch's token mean, averaged over micro-batches
      loss = g.div(total, g.make<MaxOp>({tokens, one()}));
      count = g.castTo(g.make<GreaterOp>({tokens, g.scalar(f32, 0.0)}), f32);
    } else { // dr_grpo: over completions times the constant length
      loss = g.div(total, g.scalar(f32, double(maxCompletionLength))), count = completions;
    }
    if (g.failed()) return failure();
    return sd::finishLossEntry(f, loss, count);
  }
};

} // namespace
