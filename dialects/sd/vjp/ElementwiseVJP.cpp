// Reverse-mode rules of the elementwise ops. Binary ops reduce their
// gradients back over broadcast axes (GradBuilder::unbroadcast).
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

LogicalResult addVJP(AddOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (need[0]) dx[0] = g.unbroadcast(dy[0], op.getLhs().getType());
  if (need[1]) dx[1] = g.unbroadcast(dy[0], op.getRhs().getType());
  return success();
}

LogicalResult subVJP(SubOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (need[0]) dx[0] = g.unbroadcast(dy[0], op.getLhs().getType());
  if (need[1]) dx[1] = g.unbroadcast(g.neg(dy[0]), op.getRhs().getType());
  return success();
}

LogicalResult mulVJP(MulOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (need[0]) dx[0] = g.unbroadcast(g.mul(dy[0], op.getRhs()), op.getLhs().getType());
  if (need[1]) dx[1] = g.unbroadcast(g.mul(dy[0], op.getLhs()), op.getRhs().getType());
  return success();
}

// d(a/b)/db = -y/b.
LogicalResult divVJP(DivOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (need[0]) dx[0] = g.unbroadcast(g.div(dy[0], op.getRhs()), op.getLhs().getType());
  if (need[1]) dx[1] = g.unbroadcast(g.neg(g.div(g.mul(dy[0], op.getOutput()), op.getRhs())), op.getRhs().getType());
  return success();
}

LogicalResult negVJP(NegOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.neg(dy[0]);
  return success();
}

LogicalResult identityVJP(IdentityOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = dy[0];
  return success();
}

// Random numbers do not depend on the values of `like`: nothing flows back.
LogicalResult seededRandomVJP(SeededRandomOp, GradBuilder &, ArrayRef<Value>, ArrayRef<bool>, Grads &) {
  return success();
}

// Dropout is linear in x with the mask regenerated from the same rng value.
LogicalResult seededDropoutVJP(SeededDropoutOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                               Grads &dx) {
  dx[0] = g.make<SeededDropoutOp>({dy[0], op.getRng()}, g.attrsOf(op, {"ratio", "stream"}));
  return success();
}

LogicalResult expVJP(ExpOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.mul(dy[0], op.getOutput());
  return success();
}

LogicalResult logVJP(LogOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.div(dy[0], op.getInput());
  return success();
}

LogicalResult sqrtVJP(SqrtOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.div(g.scale(dy[0], 0.5), op.getOutput());
  return success();
}

LogicalResult reciprocalVJP(ReciprocalOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.neg(g.mul(dy[0], g.mul(op.getOutput(), op.getOutput())));
  return success();
}

LogicalResult tanhVJP(TanhOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value y = op.getOutput();
  dx[0] = g.sub(dy[0], g.mul(dy[0], g.mul(y, y)));
  return success();
}

LogicalResult sigmoidVJP(SigmoidOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value y = op.getOutput();
  dx[0] = g.mul(g.mul(dy[0], y), g.sub(g.scalar(elementTypeOf(y), 1.0), y));
  return success();
}

// d erf(x) = 2/sqrt(pi) * exp(-x^2).
LogicalResult erfVJP(ErfOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  Value e = g.make<ExpOp>({g.neg(g.mul(x, x))});
  dx[0] = g.mul(dy[0], g.scale(e, 1.1283791670955126));
  return success();
}

LogicalResult reluVJP(ReluOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  Value pos = g.make<GreaterOp>({x, g.scalar(elementTypeOf(x), 0.0)});
  dx[0] = g.make<WhereOp>({pos, dy[0], g.scalar(elementTypeOf(x), 0.0)});
  return success();
}

// PyTorch's clamp backward: x's gradient passes where min <= x <= max (both
// bounds inclusive), and is zero where x was clipped. A bound that is a
// tensor (torch.clamp(x, min=t)) gets dy where it won: min where x < min
// (and min < max), max where x > max (or max < min, where max wins).
LogicalResult clipVJP(ClipOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput(), zero = g.scalar(elementTypeOf(dy[0]), 0.0), d = dy[0];
  Value lo = op.getMin() && !isa<NoneType>(op.getMin().getType()) ? op.getMin() : Value();
  Value hi = op.getMax() && !isa<NoneType>(op.getMax().getType()) ? op.getMax() : Value();
  auto where = [&](Value cond, Value target) { return g.unbroadcast(g.make<WhereOp>({cond, d, zero}), target.getType()); };
  if (lo && need.size() > 1 && need[1]) {
    Value won = g.make<LessOp>({x, lo});
    if (hi) won = g.make<AndOp>({won, g.make<LessOp>({lo, hi})});
    dx[1] = where(won, lo);
  }
  if (hi && need.size() > 2 && need[2]) {
    Value won = g.make<GreaterOp>({x, hi});
    if (lo) won = g.make<OrOp>({won, g.make<LessOp>({hi, lo})});
    dx[2] = where(won, hi);
  }
  if (!need[0]) return success();
  if (lo) d = g.make<WhereOp>({g.make<GreaterOrEqualOp>({x, lo}), d, zero});
  if (hi) d = g.make<WhereOp>({g.make<LessOrEqualOp>({x, hi}), d, zero});
  dx[0] = g.unbroadcast(d, x.getType());
  return success();
}

LogicalResult geluVJP(GeluOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  SmallVector<NamedAttribute> attrs;
  if (auto a = op.getApproximateAttr()) attrs.push_back(g.builder().getNamedAttr("approximate", a));
  dx[0] = g.make<GeluGradOp>({dy[0], op.getInput()}, attrs);
  return success();
}

// One fused kernel for both gradients.
LogicalResult swigluVJP(SwiGLUOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Operation *grad = g.op<SwiGLUGradOp>({dy[0], op.getGate(), op.getUp()}, {}, 2);
  if (!grad) return failure();
  for (unsigned i = 0; i < 2; ++i)
    if (need[i]) dx[i] = grad->getResult(i);
  return success();
}

// Packed gate and up: one gradient tensor [d gate | d up].
LogicalResult swigluPackedVJP(SwiGLUPackedOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (need[0]) dx[0] = g.make<SwiGLUPackedGradOp>({dy[0], op.getX()});
  return success();
}

// x ** c for a constant exponent: c * x ** (c - 1).
LogicalResult powVJP(PowOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (need[1]) return op.emitError("Pow: the gradient with respect to the exponent is not implemented");
  Value x = op.getLhs(), c = op.getRhs();
  c = g.castTo(c, elementTypeOf(x)); // x ** 3 with an integer 3 (torch.linalg.vector_norm(x, 3))
  Value cm1 = g.sub(c, g.scalar(elementTypeOf(x), 1.0));
  Value d = g.mul(c, g.make<PowOp>({x, cm1}));
  dx[0] = g.unbroadcast(g.mul(dy[0], d), x.getType());
  return success();
}

LogicalResult whereVJP(WhereOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value zero = g.scalar(elementTypeOf(dy[0]), 0.0);
  if (need[1]) dx[1] = g.unbroadcast(g.make<WhereOp>({op.getCondition(), dy[0], zero}), op.getX().getType());
  if (need[2]) dx[2] = g.unbroadcast(g.make<WhereOp>({op.getCondition(), zero, dy[0]}), op.getY().getType());
  return success();
}

// A run-time If: the gradient flows to the branch that was taken.
LogicalResult ifSelectVJP(IfSelectOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value zero = g.scalar(elementTypeOf(dy[0]), 0.0);
  Value cond = op.getCondition();
  if (need[1]) dx[1] = g.unbroadcast(g.make<WhereOp>({cond, dy[0], zero}), op.getThenValue().getType());
  if (need[2]) dx[2] = g.unbroadcast(g.make<WhereOp>({cond, zero, dy[0]}), op.getElseValue().getType());
  return success();
}

LogicalResult loopGuardVJP(LoopGuardOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = dy[0];
  return success();
}

// Float-to-float casts pass the gradient back in the source type (the
// importer makes CastLike a Cast).
LogicalResult castVJP(CastOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Type src = elementTypeOf(op.getInput());
  if (!isa<FloatType>(src)) return op.emitError("Cast: not differentiable from ") << src;
  dx[0] = g.castTo(dy[0], src);
  return success();
}

LogicalResult sumVJP(SumOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  for (size_t i = 0; i < dx.size(); ++i)
    if (need[i]) dx[i] = g.unbroadcast(dy[0], op.getOperand(unsigned(i)).getType());
  return success();
}

} // namespace

void attachElementwiseVJPs(MLIRContext *ctx) {
  attachVJP<AddOp, addVJP>(ctx);
  attachVJP<SubOp, subVJP>(ctx);
  attachVJP<MulOp, mulVJP>(ctx);
  attachVJP<DivOp, divVJP>(ctx);
  attachVJP<NegOp, negVJP>(ctx);
  attachVJP<IdentityOp, identityVJP>(ctx);
  attachVJP<SeededDropoutOp, seededDropoutVJP>(ctx);
  attachVJP<SeededRandomOp, seededRandomVJP>(ctx);
  attachVJP<ExpOp, expVJP>(ctx);
  attachVJP<LogOp, logVJP>(ctx);
  attachVJP<SqrtOp, sqrtVJP>(ctx);
  attachVJP<ReciprocalOp, reciprocalVJP>(ctx);
  attachVJP<TanhOp, tanhVJP>(ctx);
  attachVJP<SigmoidOp, sigmoidVJP>(ctx);
  attachVJP<ErfOp, erfVJP>(ctx);
  attachVJP<ReluOp, reluVJP>(ctx);
  attachVJP<ClipOp, clipVJP>(ctx);
  attachVJP<GeluOp, geluVJP>(ctx);
  attachVJP<SwiGLUOp, swigluVJP>(ctx);
  attachVJP<SwiGLUPackedOp, swigluPackedVJP>(ctx);
  attachVJP<PowOp, powVJP>(ctx);
  attachVJP<WhereOp, whereVJP>(ctx);
  attachVJP<IfSelectOp, ifSelectVJP>(ctx);
  attachVJP<LoopGuardOp, loopGuardVJP>(ctx);
  attachVJP<CastOp, castVJP>(ctx);
  attachVJP<SumOp, sumVJP>(ctx);
}

} // namespace sd::ir
