// Reverse-mode rules of the losses. SoftmaxCrossEntropyLoss without class
// weights and with a scalar loss is one fused kernel
// (SoftmaxCrossEntropyLossGrad). NegativeLogLikelihoodLoss, and the
// cross-entropy with class weights or reduction 'none'
// (nn.CrossEntropyLoss(weight=...), per-sample losses a model weighs itself),
// are built from graph ops: the log-probabilities' gradient
// -onehot(target) * weight[target] * s, where s is dy per element ('none'),
// dy ('sum') or dy over the summed weights of the counted targets ('mean'),
// and 0 where the target is ignore_index; then LogSoftmax's gradient.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

// d loss / d log_prob for log-probabilities `logProb` [N, C, d...] and
// targets [N, d...], as ONNX's NegativeLogLikelihoodLoss defines the loss.
Value nllGradient(GradBuilder &g, Value dy, Value logProb, Value target, Value weight,
                  std::optional<int64_t> ignoreIndex, StringRef reduction) {
  Type et = elementTypeOf(logProb);
  ArrayRef<int64_t> shape = shapeOf(logProb);
  Type targetType = elementTypeOf(target);
  Value zeroIndex = g.scalar(targetType, 0.0);
  Value counted; // bool [N, d...]: the targets that count
  if (ignoreIndex) counted = g.make<NotOp>({g.make<EqualOp>({target, g.scalar(targetType, double(*ignoreIndex))})});
  // Ignored targets may lie outside [0, C): read class 0 for them, then zero them.
  Value safe = counted ? g.make<WhereOp>({counted, target, zeroIndex}) : target;
  Value one = g.scalar(et, 1.0), zero = g.scalar(et, 0.0);
  Value perTarget = weight && !isa<NoneType>(weight.getType())
                        ? g.make<GatherOp>({weight, safe}, {g.attr("axis", int64_t(0))})
                        : g.make<ExpandOp>({one, g.ints(shapeOf(target))});
  if (counted) perTarget = g.make<WhereOp>({counted, perTarget, zero});
  Value s = g.mul(perTarget, dy); // dy: per element for 'none', else a scalar
  if (reduction == "mean") {
    SmallVector<int64_t> all;
    for (int64_t a = 0; a < int64_t(shapeOf(target).size()); ++a) all.push_back(a);
    s = g.div(s, g.reduceSum(perTarget, all, false));
  }
  auto pairType = RankedTensorType::get({2}, et);
  Value offOn = g.builder().create<ConstantOp>( // OneHot's [off, on] values: -onehot
      g.loc(), pairType,
      DenseElementsAttr::get(pairType, ArrayRef<Attribute>{FloatAttr::get(et, 0.0), FloatAttr::get(et, -1.0)}));
  Value onehot = g.make<OneHotOp>({safe, g.ints({shape[1]}), offOn}, {g.attr("axis", int64_t(1))});
  return g.mul(onehot, g.make<UnsqueezeOp>({s, g.ints({1})}));
}

// No gradient reaches the class weights: a buffer in PyTorch (nn.CrossEntropyLoss's
// `weight`), which a TorchScript export cannot tell from a parameter; left
// without a gradient, sd-autodiff keeps it frozen.
LogicalResult nllVJP(NegativeLogLikelihoodLossOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                     Grads &dx) {
  dx[0] = nllGradient(g, dy[0], op.getInput(), op.getTarget(), op.getWeight(), op.getIgnoreIndex(),
                      op.getReduction().value_or("mean"));
  return success();
}

LogicalResult sceVJP(SoftmaxCrossEntropyLossOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                     Grads &dx) {
  if (dy.size() > 1 && dy[1]) return op.emitError("SoftmaxCrossEntropyLoss: gradient through log_prob is not supported");
  StringRef red = op.getReduction().value_or("mean");
  if (isa<NoneType>(op.getWeights().getType()) && red != "none") {
    SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"ignore_index"});
    attrs.push_back(g.builder().getNamedAttr("reduction", g.builder().getStringAttr(red)));
    dx[0] = g.make<SoftmaxCrossEntropyLossGradOp>({dy[0], op.getScores(), op.getLabels()}, attrs);
    return success();
  }
  Value logProb = op.getLogProb() ? op.getLogProb() : g.make<LogSoftmaxOp>({op.getScores()}, {g.attr("axis", int64_t(1))});
  Value dLogProb = nllGradient(g, dy[0], logProb, op.getLabels(), op.getWeights(), op.getIgnoreIndex(), red);
  dx[0] = g.make<LogSoftmaxGradOp>({dLogProb, logProb}, {g.attr("axis", int64_t(1))});
  return success();
}

} // namespace

void attachLossVJPs(MLIRContext *ctx) {
  attachVJP<SoftmaxCrossEntropyLossOp, sceVJP>(ctx);
  attachVJP<NegativeLogLikelihoodLossOp, nllVJP>(ctx);
}

} // namespace sd::ir
