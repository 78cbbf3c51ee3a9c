// Reverse-mode rules of orthogonal subspace fine-tuning: the factorized
// linear's gradients come from one fused op (the high factors are frozen, so
// only the input and the low factors get gradients), and the dense
// strategy's rebuilt W passes its gradient to the low factors the same way.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

LogicalResult osftLinearVJP(OsftLinearOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (need[1] || need[2] || need[3])
    return op.emitError("OSFT's high factors are frozen; module '") << op.getModule() << "' marks them trainable";
  Value x = op.getInput();
  SmallVector<Value> operands = {dy[0], x};
  for (unsigned i = 1; i <= 6; ++i) operands.push_back(op->getOperand(i));
  Operation *grad = g.op<OsftLinearGradOp>(operands, {g.attr("input_grad", int64_t(need[0]))}, 4);
  if (!grad) return failure();
  if (need[0]) dx[0] = grad->getResult(0);
  for (unsigned i = 0; i < 3; ++i)
    if (need[4 + i]) dx[4 + i] = grad->getResult(1 + i);
  if (op->getNumOperands() > 7 && need[7]) {
    ArrayRef<int64_t> ys = shapeOf(dy[0]);
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < ys.size(); ++i) rows *= ys[i];
    dx[7] = g.reduceSum(g.reshape(dy[0], {rows, ys.back()}), {0}, false);
  }
  return success();
}

LogicalResult osftComposeVJP(OsftComposeOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (need[0] || need[1] || need[2]) return op.emitError("OSFT's high factors are frozen");
  Operation *grad = g.op<OsftComposeGradOp>({dy[0], op->getOperand(3), op->getOperand(4), op->getOperand(5)}, {}, 3);
  if (!grad) return failure();
  for (unsigned i = 0; i < 3; ++i)
    if (need[3 + i]) dx[3 + i] = grad->getResult(i);
  return success();
}

} // namespace

void attachOsftVJPs(MLIRContext *ctx) {
  attachVJP<OsftLinearOp, osftLinearVJP>(ctx);
  attachVJP<OsftComposeOp, osftComposeVJP>(ctx);
}

} // namespace sd::ir
