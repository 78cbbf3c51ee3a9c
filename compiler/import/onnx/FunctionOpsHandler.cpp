// ONNX ops that the standard defines as functions of other ops, imported as
// those sd ops after ONNX's reference (onnx/reference/ops): the fused kernels
// they become are the ones the expanded form already uses.
//   CausalConvWithState (opset 27): Concat(past or zeros, x) -> depthwise Conv
//     (group = C, valid) -> optional SiLU; present = the last k-1 positions.
//   SwiGLU (opset 28): Swish(a, alpha) * b, same shapes.
//   BatchNormalization with training_mode=1 (opset 14+), or one a dynamo
//   export traced in train mode (TorchExports.h): normalized by the
//     batch's own mean and (biased) variance over every axis but 1; the
//     running statistics are input * momentum + batch * (1 - momentum),
//     with the batch's unbiased variance where the node is PyTorch's
//     (traced), as PyTorch updates its running_var.
//     In a training plan whose running statistics are weights, the node is
//     tagged (kRunningStatisticsAttr) for sd-training-batch-norm: training
//     entries write them back, the others normalize by them (PyTorch's
//     train() and eval()).
//   GroupNormalization (opsets 18 and 21): x as [N, G, rest] normalized per
//     (n, g) by InstanceNormalization; scale/bias per channel (21) or per
//     group (18, applied before the reshape back).
#include "FunctionOpsHandler.h"
#include "OnnxImporter.h"
#include "OpMaker.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {

LogicalResult importCausalConvWithState(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"activation"}))) return failure();
  FailureOr<Value> x = optionalInput(imp, n, 0), w = optionalInput(imp, n, 1), bias = optionalInput(imp, n, 2),
                   past = optionalInput(imp, n, 3);
  if (failed(x) || failed(w) || failed(bias) || failed(past)) return failure();
  if (!*x || !*w) return imp.fail("CausalConvWithState needs input and weight");
  std::string activation = "none";
  if (const auto *a = attrOf(n, "activation")) activation = a->s();
  if (activation != "none" && activation != "silu" && activation != "swish")
    return imp.fail("activation '" + activation + "' is not none, silu or swish");
  if (!isStatic(*x) || !isStatic(*w)) return imp.fail("CausalConvWithState needs static input and weight shapes");
  ArrayRef<int64_t> xd = dimsOf(*x), wd = dimsOf(*w);
  if (xd.size() != 3 || wd.size() != 3 || wd[0] != xd[1] || wd[1] != 1 || wd[2] < 1)
    return imp.fail("CausalConvWithState takes input [B, C, L] and weight [C, 1, k]");
  int64_t batch = xd[0], channels = xd[1], length = xd[2], k = wd[2];
  OpMaker m{imp};
  Value padded = *x;
  if (k > 1) {
    Value pad = *past;
    if (!pad) pad = m.op("Expand", "expand", {m.scalar(0, elementOf(*x)), imp.constI64({batch, channels, k - 1})});
    padded = m.op("Concat", "concat", {pad, *x}, {m.i64("axis", 2)});
  } else if (*past && !dimsOf(*past).empty() && dimsOf(*past).back() != 0) {
    return imp.fail("past_state must hold k - 1 = 0 positions");
  }
  Builder &b = imp.builder;
  SmallVector<NamedAttribute> conv = {m.i64("group", channels),
                                      b.getNamedAttr("kernel_shape", b.getDenseI64ArrayAttr({k}))};
  Value y = m.op("Conv", "conv", {padded, *w, *bias ? *bias : imp.none()}, conv);
  if (activation != "none") y = m.op("Swish", "swish", {y});
  // The last k-1 positions of the padded input (none when k = 1).
  Value present = m.op("Slice", "slice", {padded, imp.constI64({length}), imp.constI64({length + k - 1}),
                                          imp.constI64({2}), imp.constI64({1})});
  if (!m.ok) return imp.fail("past_state, bias or weight do not fit input [B, C, L]");
  bindOutput(imp, n, 0, y);
  bindOutput(imp, n, 1, present);
  return success();
}

LogicalResult importSwiGlu(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"alpha"}))) return failure();
  FailureOr<Value> a = optionalInput(imp, n, 0), g = optionalInput(imp, n, 1);
  if (failed(a) || failed(g)) return failure();
  if (!*a || !*g) return imp.fail("SwiGLU needs A and B");
  if (a->getType() != g->getType()) return imp.fail("SwiGLU's A and B must have the same shape and type");
  OpMaker m{imp};
  float alpha = 1.0f;
  if (const auto *at = attrOf(n, "alpha")) alpha = at->f();
  Value swish = m.op("Swish", "swish", {*a}, {imp.builder.getNamedAttr("alpha", imp.builder.getF32FloatAttr(alpha))});
  Value y = m.op("Mul", "mul", {swish, *g});
  if (!m.ok) return failure();
  bindOutput(imp, n, 0, y);
  return success();
}

LogicalResult importBatchNormTraining(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"epsilon", "momentum", "training_mode"}))) return failure();
  FailureOr<Value> x = optionalInput(imp, n, 0), scale = optionalInput(imp, n, 1), bias = optionalInput(imp, n, 2),
                   mean = optionalInput(imp, n, 3), var = optionalInput(imp, n, 4);
  // A dynamo export traced in train mode: the statistics' own weights.
  auto traced = imp.trainModeNorms.find(n.name());
  const bool pytorchRule = traced != imp.trainModeNorms.end();
  if (pytorchRule) mean = imp.lookup(traced->second[0]), var = imp.lookup(traced->second[1]);
  if (failed(x) || failed(scale) || failed(bias) || failed(mean) || failed(var)) return failure();
  if (!*x || !*scale || !*bias || !*mean || !*var) return imp.fail("BatchNormalization needs five inputs");
  if (!isStatic(*x) || dimsOf(*x).size() < 2) return imp.fail("BatchNormalization needs a static [N, C, ...] input");
  ArrayRef<int64_t> xd = dimsOf(*x);
  SmallVector<int64_t> axes = {0}, perChannel(xd.size() - 1, 1);
  int64_t perChannelCount = xd[0]; // the elements each channel's statistics average
  for (int64_t d = 2; d < int64_t(xd.size()); ++d) axes.push_back(d), perChannelCount *= xd[size_t(d)];
  perChannel[0] = xd[1];
  float epsilon = 1e-5f, momentum = 0.9f;
  if (const auto *e = attrOf(n, "epsilon")) epsilon = e->f();
  if (const auto *mo = attrOf(n, "momentum")) momentum = mo->f();
  OpMaker m{imp};
  Type et = elementOf(*x);
  auto channelMean = [&](Value v) { return m.op("ReduceMean", "reduce_mean", {v, imp.constI64(axes)}, {m.i64("keepdims", 0)}); };
  Value batchMean = channelMean(*x);
  Value centered = m.op("Sub", "sub", {*x, m.reshape(batchMean, perChannel)});
  Value batchVar = channelMean(m.op("Mul", "mul", {centered, centered}));
  Value y = m.op("BatchNormalization", "batch_normalization", {*x, *scale, *bias, batchMean, batchVar},
                 {imp.builder.getNamedAttr("epsilon", imp.builder.getF32FloatAttr(epsilon))});
  auto blend = [&](Value running, Value batch) {
    return m.op("Add", "add", {m.op("Mul", "mul", {running, m.scalar(momentum, et)}),
                               m.op("Mul", "mul", {batch, m.scalar(1.0 - double(momentum), et)})});
  };
  Value runningMean = blend(*mean, batchMean), runningVar = blend(*var, batchVar);
  if (!m.ok) return imp.fail("scale, bias, mean and var must have one element per channel");
  auto meanLoad = mean->getDefiningOp<GlobalLoadOp>(), varLoad = var->getDefiningOp<GlobalLoadOp>();
  if (imp.options && imp.options->training && meanLoad && varLoad) {
    Builder &b = imp.builder;
    // PyTorch's running variance takes the batch's unbiased variance (over
    // every rank's batch), ONNX's the biased: the count n tells
    // sd-training-batch-norm to scale by n / (n - 1), 0 keeps ONNX's rule.
    int64_t unbiasedCount = pytorchRule && perChannelCount > 1 ? perChannelCount : 0;
    y.getDefiningOp()->setAttr(kRunningStatisticsAttr,
                               b.getArrayAttr({meanLoad.getGlobalAttr(), varLoad.getGlobalAttr(), b.getF32FloatAttr(momentum),
                                               b.getI64IntegerAttr(unbiasedCount)}));
  }
  bindOutput(imp, n, 0, y);
  bindOutput(imp, n, 1, runningMean);
  bindOutput(imp, n, 2, runningVar);
  return success();
}

LogicalResult importGroupNormalization(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec) {
  if (failed(onlyAttrs(imp, n, {"epsilon", "num_groups", "stash_type"}))) return failure();
  FailureOr<Value> x = optionalInput(imp, n, 0), scale = optionalInput(imp, n, 1), bias = optionalInput(imp, n, 2);
  if (failed(x) || failed(scale) || failed(bias)) return failure();
  if (!*x || !*scale || !*bias) return imp.fail("GroupNormalization needs X, scale and bias");
  const auto *groupsAttr = attrOf(n, "num_groups");
  if (!groupsAttr) return imp.fail("missing attribute 'num_groups'");
  if (const auto *st = attrOf(n, "stash_type"); st && st->i() != 1)
    return imp.fail("stash_type other than 1 (float) is not supported");
  if (!isStatic(*x)) return imp.fail("GroupNormalization needs a static input shape");
  ArrayRef<int64_t> xd = dimsOf(*x);
  int64_t groups = groupsAttr->i();
  if (xd.size() < 2 || groups < 1 || xd[1] % groups)
    return imp.fail("num_groups must divide the channels of X [N, C, ...]");
  int64_t rest = 1;
  for (size_t i = 1; i < xd.size(); ++i) rest *= xd[i];
  rest /= groups;
  float epsilon = 1e-5f;
  if (const auto *e = attrOf(n, "epsilon")) epsilon = e->f();
  OpMaker m{imp};
  Type et = elementOf(*x);
  bool perGroup = spec.sinceVersion < 21; // opset 18: scale and bias are [G]
  Value ones = m.op("Expand", "expand", {m.scalar(1, et), imp.constI64({groups})});
  Value zeros = m.op("Expand", "expand", {m.scalar(0, et), imp.constI64({groups})});
  Value grouped = m.reshape(*x, {xd[0], groups, rest});
  Value normed = m.op("InstanceNormalization", "instance_normalization",
                      {grouped, perGroup ? *scale : ones, perGroup ? *bias : zeros},
                      {imp.builder.getNamedAttr("epsilon", imp.builder.getF32FloatAttr(epsilon))});
  Value y = m.reshape(normed, xd);
  if (!perGroup) {
    SmallVector<int64_t> perChannel(xd.size() - 1, 1);
    perChannel[0] = xd[1];
    y = m.op("Add", "add", {m.op("Mul", "mul", {y, m.reshape(*scale, perChannel)}), m.reshape(*bias, perChannel)});
  }
  if (!m.ok) return imp.fail(perGroup ? "scale and bias must have num_groups elements"
                                      : "scale and bias must have one element per channel");
  bindOutput(imp, n, 0, y);
  return success();
}

} // namespace sd
