// Reverse-mode rules of the trigonometric and hyperbolic functions and their
// inverses (Sin and Cos are with the activations), by their derivatives:
// tan' = 1 + tan², asin' = 1/√(1-x²), acos' = -1/√(1-x²), atan' = 1/(1+x²),
// sinh' = cosh, cosh' = sinh, asinh' = 1/√(x²+1), acosh' = 1/√(x²-1),
// atanh' = 1/(1-x²).
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

// c + s·x² (s = ±1), in x's type.
Value shiftedSquare(GradBuilder &g, Value x, double c, double s) {
  Value sq = g.mul(x, x);
  Value k = g.scalar(elementTypeOf(x), c);
  return s > 0 ? g.add(k, sq) : g.sub(k, sq);
}

LogicalResult tanVJP(TanOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.mul(dy[0], shiftedSquare(g, op.getOutput(), 1.0, 1.0));
  return success();
}

LogicalResult asinVJP(AsinOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.div(dy[0], g.make<SqrtOp>({shiftedSquare(g, op.getInput(), 1.0, -1.0)}));
  return success();
}

LogicalResult acosVJP(AcosOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.neg(g.div(dy[0], g.make<SqrtOp>({shiftedSquare(g, op.getInput(), 1.0, -1.0)})));
  return success();
}

LogicalResult atanVJP(AtanOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.div(dy[0], shiftedSquare(g, op.getInput(), 1.0, 1.0));
  return success();
}

LogicalResult sinhVJP(SinhOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.mul(dy[0], g.make<CoshOp>({op.getInput()}));
  return success();
}

LogicalResult coshVJP(CoshOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.mul(dy[0], g.make<SinhOp>({op.getInput()}));
  return success();
}

LogicalResult asinhVJP(AsinhOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.div(dy[0], g.make<SqrtOp>({shiftedSquare(g, op.getInput(), 1.0, 1.0)}));
  return success();
}

LogicalResult acoshVJP(AcoshOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.div(dy[0], g.make<SqrtOp>({shiftedSquare(g, op.getInput(), -1.0, 1.0)}));
  return success();
}

LogicalResult atanhVJP(AtanhOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.div(dy[0], shiftedSquare(g, op.getInput(), 1.0, -1.0));
  return success();
}

} // namespace

void attachTrigonometricVJPs(MLIRContext *ctx) {
  attachVJP<TanOp, tanVJP>(ctx);
  attachVJP<AsinOp, asinVJP>(ctx);
  attachVJP<AcosOp, acosVJP>(ctx);
  attachVJP<AtanOp, atanVJP>(ctx);
  attachVJP<SinhOp, sinhVJP>(ctx);
  attachVJP<CoshOp, coshVJP>(ctx);
  attachVJP<AsinhOp, asinhVJP>(ctx);
  attachVJP<AcoshOp, acoshVJP>(ctx);
  attachVJP<AtanhOp, atanhVJP>(ctx);
}

} // namespace sd::ir
