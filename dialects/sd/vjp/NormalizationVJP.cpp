// Reverse-mode rules of Softmax/LogSoftmax, LayerNormalization,
// BatchNormalization and InstanceNormalization: each backward but
// BatchNormalization's and InstanceNormalization's (a few elementwise ops
// and sums) is one fused kernel.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

template <typename OpT, typename GradOpT>
LogicalResult softmaxVJP(OpT op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  ArrayRef<int64_t> ys = shapeOf(op.getOutput());
  int64_t axis = axisOf(op.getAxis().value_or(-1), int64_t(ys.size()));
  if (!op.getCoerce2d().value_or(0) || axis == int64_t(ys.size()) - 1) {
    dx[0] = g.make<GradOpT>({dy[0], op.getOutput()}, {g.attr("axis", axis)});
    return success();
  }
  // Opset < 13: a softmax over the rows of the [d0..d(axis-1), d(axis)..] matrix.
  int64_t rows = 1, cols = 1;
  for (size_t i = 0; i < ys.size(); ++i) (int64_t(i) < axis ? rows : cols) *= ys[i];
  Value grad = g.make<GradOpT>({g.reshape(dy[0], {rows, cols}), g.reshape(op.getOutput(), {rows, cols})},
                               {g.attr("axis", int64_t(1))});
  dx[0] = g.reshape(grad, ys);
  return success();
}

// Whether the gradient of operand i is needed (`need` may be shorter than the operands).
bool wanted(ArrayRef<bool> need, size_t i) { return i < need.size() && need[i]; }

LogicalResult layerNormVJP(LayerNormalizationOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                           Grads &dx) {
  for (size_t i = 1; i < dy.size(); ++i)
    if (dy[i]) return op.emitError("LayerNormalization: gradients through Mean/InvStdDev are not supported");
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"epsilon"});
  attrs.push_back(g.attr("axis", op.getAxis().value_or(-1)));
  if (!wanted(need, 1) && !wanted(need, 2)) attrs.push_back(g.attr("param_grads", int64_t(0)));
  Operation *grad = g.op<LayerNormalizationGradOp>({dy[0], op.getX(), op.getScale()}, attrs, 3);
  if (!grad) return failure();
  for (unsigned i = 0; i < 3 && i < dx.size(); ++i)
    if (need[i]) dx[i] = grad->getResult(i);
  return success();
}

LogicalResult rmsNormVJP(RMSNormalizationOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                         Grads &dx) {
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"epsilon"});
  attrs.push_back(g.attr("axis", op.getAxis().value_or(-1)));
  if (!wanted(need, 1)) attrs.push_back(g.attr("param_grads", int64_t(0)));
  Operation *grad = g.op<RMSNormalizationGradOp>({dy[0], op.getX(), op.getScale()}, attrs, 2);
  if (!grad) return failure();
  for (unsigned i = 0; i < 2 && i < dx.size(); ++i)
    if (need[i]) dx[i] = grad->getResult(i);
  return success();
}

// Per (item, channel) over the spatial axes, as PyTorch's GroupNorm exports
// it (Reshape, InstanceNormalization, scale and shift): with x^ the
// normalized input and g = dy * scale, dx = rstd (g - mean(g) - x^ mean(g x^)),
// dscale = sum(dy x^) and dbias = sum(dy) over the batch and spatial axes.
LogicalResult instanceNormVJP(InstanceNormalizationOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                              Grads &dx) {
  Value x = op.getInput();
  ArrayRef<int64_t> xs = shapeOf(x);
  Type et = elementTypeOf(x);
  int64_t rank = int64_t(xs.size());
  SmallVector<int64_t> spatial, perChannel(size_t(rank), 1), sums = {0};
  for (int64_t a = 2; a < rank; ++a) spatial.push_back(a), sums.push_back(a);
  perChannel[1] = xs[1];
  auto mean = [&](Value v) { return g.make<ReduceMeanOp>({v, g.ints(spatial)}, {g.attr("keepdims", int64_t(1))}); };
  Value centered = g.sub(x, mean(x));
  double eps = op.getEpsilon() ? double(op.getEpsilon()->convertToFloat()) : 1e-5;
  Value rstd = g.make<ReciprocalOp>(
      {g.make<SqrtOp>({g.add(mean(g.mul(centered, centered)), g.scalar(et, eps))})});
  Value xhat = g.mul(centered, rstd);
  if (need[0]) {
    Value gy = g.mul(dy[0], g.reshape(op.getScale(), perChannel));
    dx[0] = g.mul(rstd, g.sub(g.sub(gy, mean(gy)), g.mul(xhat, mean(g.mul(gy, xhat)))));
  }
  if (need[1]) dx[1] = g.reduceSum(g.mul(dy[0], xhat), sums, false);
  if (need[2]) dx[2] = g.reduceSum(dy[0], sums, false);
  return success();
}


// Whether mean and var are x's own statistics over `axes` as the importer
// computes a train-mode node's: ReduceMean(x) and ReduceMean(c * c) with
// c = x - mean (the biased variance).
bool statisticsOfX(BatchNormalizationOp op, ArrayRef<int64_t> axes) {
  auto over = [&](ReduceMeanOp r) {
    SmallVector<int64_t> got;
    return r && r.getKeepdims().value_or(1) == 0 && constantInts(r.getAxes(), got) && ArrayRef<int64_t>(got) == axes;
  };
  auto meanOp = op.getInputMean().getDefiningOp<ReduceMeanOp>();
  auto varOp = op.getInputVar().getDefiningOp<ReduceMeanOp>();
  if (!over(meanOp) || !over(varOp) || meanOp.getData() != op.getX()) return false;
  auto square = varOp.getData().getDefiningOp<MulOp>();
  auto centered = square && square.getLhs() == square.getRhs() ? square.getLhs().getDefiningOp<SubOp>() : SubOp();
  if (!centered || centered.getLhs() != op.getX()) return false;
  Value mean = centered.getRhs();
  if (auto reshape = mean.getDefiningOp<ReshapeOp>()) mean = reshape.getLhs();
  return mean == op.getInputMean();
}

// BatchNormalization, y = (x - mean) * k + bias with the per-channel
// k = scale * r, r = 1 / sqrt(var + eps), summing over the N elements of a
// channel. Statistics read from weights (a model exported in eval mode) get
// no gradient: PyTorch's running buffers are not parameters, so full
// fine-tuning leaves them frozen. When they are x's own (a train-mode node),
// x's gradient through them is folded into one expression, as PyTorch's
// kernels do, and the ReduceMeans get none:
//   dx = k * (dy - sum(dy) / N - (x - mean) * r^2 * sum(dy * (x - mean)) / N),
// the two means over every rank's batch once sd-training-batch-norm syncs them.
// Other computed statistics pass theirs on to whatever made them:
//   dmean = -k * sum(dy),  dvar = -scale * r^3 / 2 * sum(dy * (x - mean)).
LogicalResult batchNormVJP(BatchNormalizationOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                           Grads &dx) {
  if (op.getTrainingMode().value_or(0))
    return op.emitError("BatchNormalization with training_mode=1 is not differentiable yet; export in eval mode");
  auto computed = [&](unsigned i) { return wanted(need, i) && !op->getOperand(i).getDefiningOp<GlobalLoadOp>(); };
  ArrayRef<int64_t> xs = shapeOf(op.getX());
  SmallVector<int64_t> perChannel(xs.size() - 1, 1), axes = {0};
  perChannel[0] = xs[1];
  int64_t count = xs[0];
  for (int64_t i = 2; i < int64_t(xs.size()); ++i) axes.push_back(i), count *= xs[i];
  const bool ownStatistics = need[0] && (computed(3) || computed(4)) && statisticsOfX(op, axes);
  Type et = elementTypeOf(op.getX());
  double eps = op.getEpsilon() ? double(op.getEpsilon()->convertToFloat()) : 1e-5;
  Value rstd = g.make<ReciprocalOp>({g.make<SqrtOp>({g.add(op.getInputVar(), g.scalar(et, eps))})});
  Value k = g.mul(op.getScale(), rstd);
  Value centered, dySum, dyCentered; // x - mean; sum(dy); sum(dy * (x - mean))
  if (need[1] || computed(4)) centered = g.sub(op.getX(), g.reshape(op.getInputMean(), perChannel));
  if (need[2] || computed(3)) dySum = g.reduceSum(dy[0], axes, false);
  if (need[1] || computed(4)) dyCentered = g.reduceSum(g.mul(dy[0], centered), axes, false);
  if (need[0]) dx[0] = g.mul(dy[0], g.reshape(k, perChannel));
  if (need[1]) dx[1] = g.mul(dyCentered, rstd);
  if (need[2]) dx[2] = dySum;
  if (ownStatistics) {
    // The two per-channel means as one [2C] vector, tagged so
    // sd-training-batch-norm can average it over data-parallel ranks (one
    // collective) as it does the forward's statistics.
    Value means = g.scale(g.make<ConcatOp>({dySum, dyCentered}, {g.attr("axis", 0)}), 1.0 / double(count));
    if (g.failed()) return op.emitError("cannot build BatchNormalization's gradient through its batch statistics");
    means.getDefiningOp()->setAttr(kCrossRankMeanAttr, g.builder().getUnitAttr());
    const int64_t channels = xs[1];
    auto half = [&](int64_t begin) {
      return g.make<SliceOp>({means, g.ints({begin}), g.ints({begin + channels}), g.ints({0}), g.none()});
    };
    Value shift = g.mul(k, half(0)), slope = g.mul(g.mul(k, g.mul(rstd, rstd)), half(channels));
    dx[0] = g.sub(g.sub(dx[0], g.reshape(shift, perChannel)), g.mul(centered, g.reshape(slope, perChannel)));
    return success();
  }
  if (computed(3)) dx[3] = g.neg(g.mul(dySum, k));
  if (computed(4)) dx[4] = g.scale(g.mul(dyCentered, g.mul(op.getScale(), g.mul(rstd, g.mul(rstd, rstd)))), -0.5);
  return success();
}

} // namespace

void attachNormalizationVJPs(MLIRContext *ctx) {
  attachVJP<SoftmaxOp, softmaxVJP<SoftmaxOp, SoftmaxGradOp>>(ctx);
  attachVJP<LogSoftmaxOp, softmaxVJP<LogSoftmaxOp, LogSoftmaxGradOp>>(ctx);
  attachVJP<LayerNormalizationOp, layerNormVJP>(ctx);
  attachVJP<InstanceNormalizationOp, instanceNormVJP>(ctx);
  attachVJP<RMSNormalizationOp, rmsNormVJP>(ctx);
  attachVJP<BatchNormalizationOp, batchNormVJP>(ctx);
}

} // namespace sd::ir
