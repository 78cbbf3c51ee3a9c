// Reverse-mode rules of the activation functions and the other unary and
// n-ary elementwise ops users put in models they train (L1 losses' Abs,
// LeakyReLU, ELU, Softplus, Mish, HardSwish, PReLU, torch.maximum, ...).
// Each follows PyTorch's backward formula, so full fine-tuning matches it:
// the same branch conditions (strict or not), the same ties.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

double attrOr(std::optional<APFloat> a, double fallback) {
  return a ? double(a->convertToFloat()) : fallback;
}

Value zeroLike(GradBuilder &g, Value v) { return g.scalar(elementTypeOf(v), 0.0); }

// dy where `cond`, else dy * `otherwise` (null: 0).
Value select(GradBuilder &g, Value cond, Value dy, Value otherwise) {
  return g.make<WhereOp>({cond, dy, otherwise ? otherwise : zeroLike(g, dy)});
}

Value positive(GradBuilder &g, Value x) { return g.make<GreaterOp>({x, zeroLike(g, x)}); }

// |x|' = sign(x), 0 at 0 (torch.sgn).
LogicalResult absVJP(AbsOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.mul(dy[0], g.make<SignOp>({op.getInput()}));
  return success();
}

LogicalResult leakyReluVJP(LeakyReluOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  dx[0] = select(g, positive(g, x), dy[0], g.scale(dy[0], attrOr(op.getAlpha(), 0.01)));
  return success();
}

// ELU-family negative side: dy * coef * exp(x * inputScale), as PyTorch's
// elu_backward computes it from the input.
Value expSide(GradBuilder &g, Value dy, Value x, double coef, double inputScale) {
  Value e = g.make<ExpOp>({inputScale == 1.0 ? x : g.scale(x, inputScale)});
  return g.mul(dy, g.scale(e, coef));
}

LogicalResult eluVJP(EluOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  dx[0] = select(g, positive(g, x), dy[0], expSide(g, dy[0], x, attrOr(op.getAlpha(), 1.0), 1.0));
  return success();
}

LogicalResult seluVJP(SeluOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  double alpha = attrOr(op.getAlpha(), 1.67326319217681884765625);
  double gamma = attrOr(op.getGamma(), 1.05070102214813232421875);
  dx[0] = select(g, positive(g, x), g.scale(dy[0], gamma), expSide(g, dy[0], x, alpha * gamma, 1.0));
  return success();
}

LogicalResult celuVJP(CeluOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  double alpha = attrOr(op.getAlpha(), 1.0);
  dx[0] = select(g, positive(g, x), dy[0], expSide(g, dy[0], x, 1.0, 1.0 / alpha));
  return success();
}

LogicalResult thresholdedReluVJP(ThresholdedReluOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                                 Grads &dx) {
  Value x = op.getInput();
  dx[0] = select(g, g.make<GreaterOp>({x, g.scalar(elementTypeOf(x), attrOr(op.getAlpha(), 1.0))}), dy[0], {});
  return success();
}

// Soft and hard shrinkage (x ∓ bias beyond ±lambd, else 0): dy strictly
// beyond ±lambd, as PyTorch's softshrink and hardshrink backward.
LogicalResult shrinkVJP(ShrinkOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  double lambd = attrOr(op.getLambd(), 0.5);
  Value beyond = g.make<OrOp>({g.make<GreaterOp>({x, g.scalar(elementTypeOf(x), lambd)}),
                               g.make<LessOp>({x, g.scalar(elementTypeOf(x), -lambd)})});
  dx[0] = select(g, beyond, dy[0], {});
  return success();
}

// softplus(x) = log(1 + exp(x)): dy * sigmoid(x).
LogicalResult softplusVJP(SoftplusOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.mul(dy[0], g.make<SigmoidOp>({op.getInput()}));
  return success();
}

// x / (1 + |x|): dy / (1 + |x|)^2.
LogicalResult softsignVJP(SoftsignOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  Value d = g.add(g.scalar(elementTypeOf(x), 1.0), g.make<AbsOp>({x}));
  dx[0] = g.div(dy[0], g.mul(d, d));
  return success();
}

// max(0, min(1, alpha x + beta)): alpha * dy strictly inside (0, 1), as
// PyTorch's hardsigmoid_backward (-3 < x < 3 for its alpha 1/6, beta 1/2).
LogicalResult hardSigmoidVJP(HardSigmoidOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  Type et = elementTypeOf(x);
  double alpha = attrOr(op.getAlpha(), 0.2), beta = attrOr(op.getBeta(), 0.5);
  Value low = g.scalar(et, -beta / alpha), high = g.scalar(et, (1.0 - beta) / alpha);
  Value inside = g.make<AndOp>({g.make<GreaterOp>({x, low}), g.make<LessOp>({x, high})});
  dx[0] = select(g, inside, g.scale(dy[0], alpha), {});
  return success();
}

// x * relu6(x + 3) / 6: 0 below -3, dy * (x / 3 + 1/2) up to 3 (inclusive),
// dy above: PyTorch's hardswish_backward.
LogicalResult hardSwishVJP(HardSwishOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  Type et = elementTypeOf(x);
  Value ramp = g.mul(dy[0], g.add(g.div(x, g.scalar(et, 3.0)), g.scalar(et, 0.5)));
  Value upper = g.make<WhereOp>({g.make<LessOrEqualOp>({x, g.scalar(et, 3.0)}), ramp, dy[0]});
  dx[0] = g.make<WhereOp>({g.make<LessOp>({x, g.scalar(et, -3.0)}), zeroLike(g, dy[0]), upper});
  return success();
}

// x * tanh(softplus(x)): dy * (t + x * sigmoid(x) * (1 - t^2)), t = tanh(softplus(x)).
LogicalResult mishVJP(MishOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  Value t = g.make<TanhOp>({g.make<SoftplusOp>({x})});
  Value oneMinus = g.sub(g.scalar(elementTypeOf(x), 1.0), g.mul(t, t));
  dx[0] = g.mul(dy[0], g.add(t, g.mul(g.mul(x, g.make<SigmoidOp>({x})), oneMinus)));
  return success();
}

// x * sigmoid(alpha x): dy * (s + alpha x s (1 - s)).
LogicalResult swishVJP(SwishOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  double alpha = attrOr(op.getAlpha(), 1.0);
  Value s = g.make<SigmoidOp>({alpha == 1.0 ? x : g.scale(x, alpha)});
  Value ax = alpha == 1.0 ? x : g.scale(x, alpha);
  Value ds = g.mul(g.mul(ax, s), g.sub(g.scalar(elementTypeOf(x), 1.0), s));
  dx[0] = g.mul(dy[0], g.add(s, ds));
  return success();
}

LogicalResult sinVJP(SinOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.mul(dy[0], g.make<CosOp>({op.getInput()}));
  return success();
}

LogicalResult cosVJP(CosOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.neg(g.mul(dy[0], g.make<SinOp>({op.getInput()})));
  return success();
}

// x > 0 ? x : slope * x, slope broadcast (per channel, or one value): the
// slope, a parameter, gets dy * x where x <= 0, summed over its broadcast.
LogicalResult preluVJP(PReluOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getLhs(), slope = op.getRhs(), pos = positive(g, x);
  if (need[0]) dx[0] = g.unbroadcast(select(g, pos, dy[0], g.mul(dy[0], slope)), x.getType());
  if (need[1])
    dx[1] = g.unbroadcast(g.make<WhereOp>({pos, zeroLike(g, dy[0]), g.mul(dy[0], x)}), slope.getType());
  return success();
}

// Piecewise-constant ops: zero almost everywhere, as PyTorch's floor, ceil,
// round and sign give (no gradient reaches their operand).
template <typename OpT>
LogicalResult zeroVJP(OpT op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  return success();
}

// Max or Min of n operands: each operand equal to the result gets dy split
// evenly among the operands that tie there (torch.maximum halves a tie).
template <typename OpT>
LogicalResult extremeVJP(OpT op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (op->getNumOperands() == 1) { // the dynamo exporter's Max of one operand is that operand
    dx[0] = dy[0];
    return success();
  }
  Value y = op->getResult(0);
  SmallVector<Value> hits;
  Value ties;
  for (Value x : op->getOperands()) {
    hits.push_back(g.equalMask(x, y));
    ties = ties ? g.add(ties, hits.back()) : hits.back();
  }
  Value share = g.div(dy[0], ties);
  for (auto [i, x] : llvm::enumerate(op->getOperands()))
    if (need[i]) dx[i] = g.unbroadcast(g.mul(share, hits[i]), x.getType());
  return success();
}

LogicalResult meanVJP(MeanOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value share = g.scale(dy[0], 1.0 / double(op->getNumOperands()));
  for (auto [i, x] : llvm::enumerate(op->getOperands()))
    if (need[i]) dx[i] = g.unbroadcast(share, x.getType());
  return success();
}

} // namespace

void attachActivationVJPs(MLIRContext *ctx) {
  attachVJP<AbsOp, absVJP>(ctx);
  attachVJP<LeakyReluOp, leakyReluVJP>(ctx);
  attachVJP<EluOp, eluVJP>(ctx);
  attachVJP<SeluOp, seluVJP>(ctx);
  attachVJP<CeluOp, celuVJP>(ctx);
  attachVJP<ThresholdedReluOp, thresholdedReluVJP>(ctx);
  attachVJP<ShrinkOp, shrinkVJP>(ctx);
  attachVJP<SoftplusOp, softplusVJP>(ctx);
  attachVJP<SoftsignOp, softsignVJP>(ctx);
  attachVJP<HardSigmoidOp, hardSigmoidVJP>(ctx);
  attachVJP<HardSwishOp, hardSwishVJP>(ctx);
  attachVJP<MishOp, mishVJP>(ctx);
  attachVJP<SwishOp, swishVJP>(ctx);
  attachVJP<SinOp, sinVJP>(ctx);
  attachVJP<CosOp, cosVJP>(ctx);
  attachVJP<PReluOp, preluVJP>(ctx);
  attachVJP<FloorOp, zeroVJP<FloorOp>>(ctx);
  attachVJP<CeilOp, zeroVJP<CeilOp>>(ctx);
  attachVJP<RoundOp, zeroVJP<RoundOp>>(ctx);
  attachVJP<SignOp, zeroVJP<SignOp>>(ctx);
  attachVJP<MaxOp, extremeVJP<MaxOp>>(ctx);
  attachVJP<MinOp, extremeVJP<MinOp>>(ctx);
  attachVJP<MeanOp, meanVJP>(ctx);
}

} // namespace sd::ir
