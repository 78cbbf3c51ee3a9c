// Reverse-mode rules of the reductions (the gradient stretched back over the
// reduced axes, GradBuilder::broadcastTo, times each reduction's local
// derivative, as PyTorch's backward formulas give it) and of CumSum.
#include "GradBuilder.h"
#include <algorithm>

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

// The reduced axes (reducedAxesOf); none for a no-op reduction.
LogicalResult reduceAxes(Operation *op, SmallVectorImpl<int64_t> &axes) {
  if (!reducedAxesOf(op, axes)) return op->emitError("reduction with non-constant axes is not differentiable");
  return success();
}

// reduceAxes, and whether there are any: a no-op reduction is its input, so
// it passes dy straight on (dx[0] = dy) and the rule is done.
FailureOr<bool> reducesAny(Operation *op, SmallVectorImpl<int64_t> &axes, Value dy, Grads &dx) {
  if (failed(reduceAxes(op, axes))) return failure();
  if (!axes.empty()) return true;
  dx[0] = dy;
  return false;
}

template <typename OpT, bool Mean>
LogicalResult reduceVJP(OpT op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  SmallVector<int64_t> axes;
  FailureOr<bool> any = reducesAny(op, axes, dy[0], dx);
  if (failed(any) || !*any) return success(succeeded(any)); // an error, or dx = dy for a no-op reduction
  Value d = dy[0];
  if (Mean) {
    int64_t count = 1;
    for (int64_t a : axes) count *= shapeOf(op.getData())[size_t(a)];
    d = g.scale(d, 1.0 / double(std::max<int64_t>(count, 1)));
  }
  dx[0] = g.broadcastTo(d, op.getData().getType(), axes);
  return success();
}

// y = sqrt(sum x^2): dx = dy * x / y, and 0 where a group's norm is 0 (its x
// are all 0 then, so x / 1 gives it; PyTorch's vector_norm backward agrees).
LogicalResult reduceL2VJP(ReduceL2Op op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  SmallVector<int64_t> axes;
  FailureOr<bool> any = reducesAny(op, axes, dy[0], dx);
  if (failed(any) || !*any) return success(succeeded(any)); // an error, or dx = dy for a no-op reduction
  Type et = elementTypeOf(op.getData());
  Value norm = g.broadcastTo(op->getResult(0), op.getData().getType(), axes);
  Value zero = g.scalar(et, 0.0);
  Value safe = g.make<WhereOp>({g.make<EqualOp>({norm, zero}), g.scalar(et, 1.0), norm});
  dx[0] = g.mul(g.broadcastTo(dy[0], op.getData().getType(), axes), g.div(op.getData(), safe));
  return success();
}

// dy stretched back over `op`'s reduced axes (dy itself for a no-op
// reduction), for the rules dx = that * f(x).
template <typename OpT> Value stretched(OpT op, GradBuilder &g, Value dy) {
  SmallVector<int64_t> axes;
  if (failed(reduceAxes(op, axes))) return Value();
  return axes.empty() ? dy : g.broadcastTo(dy, op.getData().getType(), axes);
}

// y = sum x^2: dx = 2 x dy.
LogicalResult reduceSumSquareVJP(ReduceSumSquareOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                                 Grads &dx) {
  Value d = stretched(op, g, dy[0]);
  if (!d) return failure();
  dx[0] = g.mul(d, g.scale(op.getData(), 2.0));
  return success();
}

// y = sum |x|: dx = sign(x) dy.
LogicalResult reduceL1VJP(ReduceL1Op op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value d = stretched(op, g, dy[0]);
  if (!d) return failure();
  dx[0] = g.mul(d, g.make<SignOp>({op.getData()}));
  return success();
}

// y = log sum exp x: dx = dy exp(x - y).
LogicalResult reduceLogSumExpVJP(ReduceLogSumExpOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                                 Grads &dx) {
  SmallVector<int64_t> axes;
  FailureOr<bool> any = reducesAny(op, axes, dy[0], dx);
  if (failed(any) || !*any) return success(succeeded(any)); // an error, or dx = dy for a no-op reduction
  Value x = op.getData();
  Value y = g.broadcastTo(op->getResult(0), x.getType(), axes);
  dx[0] = g.mul(g.broadcastTo(dy[0], x.getType(), axes), g.make<ExpOp>({g.sub(x, y)}));
  return success();
}

// y = max (min) over the axes: dy split evenly among the elements equal to
// y, as PyTorch's amax/amin backward.
template <typename OpT>
LogicalResult reduceExtremeVJP(OpT op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  SmallVector<int64_t> axes;
  FailureOr<bool> any = reducesAny(op, axes, dy[0], dx);
  if (failed(any) || !*any) return success(succeeded(any)); // an error, or dx = dy for a no-op reduction
  Value x = op.getData();
  Value hit = g.equalMask(x, g.broadcastTo(op->getResult(0), x.getType(), axes));
  Value ties = g.broadcastTo(g.reduceSum(hit, axes, /*keepdims=*/true), x.getType(), axes);
  dx[0] = g.div(g.mul(g.broadcastTo(dy[0], x.getType(), axes), hit), ties);
  return success();
}

// y = log sum x: dx = dy / sum x = dy / exp(y).
LogicalResult reduceLogSumVJP(ReduceLogSumOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                              Grads &dx) {
  SmallVector<int64_t> axes;
  if (failed(reduceAxes(op, axes))) return failure();
  Value x = op.getData();
  if (axes.empty()) {
    dx[0] = g.div(dy[0], x); // log(x)
    return success();
  }
  Value sum = g.broadcastTo(g.make<ExpOp>({op->getResult(0)}), x.getType(), axes);
  dx[0] = g.div(g.broadcastTo(dy[0], x.getType(), axes), sum);
  return success();
}

// y = prod x: each x gets dy times the product of the others, exact where
// some are 0 (as PyTorch's prod backward): the reduced axes moved last and
// flattened, the exclusive running products from both ends multiplied.
LogicalResult reduceProdVJP(ReduceProdOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  SmallVector<int64_t> axes;
  FailureOr<bool> any = reducesAny(op, axes, dy[0], dx);
  if (failed(any) || !*any) return success(succeeded(any)); // an error, or dx = dy for a no-op reduction
  Value x = op.getData();
  ArrayRef<int64_t> xs = shapeOf(x);
  SmallVector<int64_t> perm, inverse(xs.size()), flat, moved;
  int64_t reduced = 1;
  for (int64_t a = 0; a < int64_t(xs.size()); ++a)
    if (!llvm::is_contained(axes, a)) perm.push_back(a), flat.push_back(xs[size_t(a)]);
  for (int64_t a : axes) perm.push_back(a), reduced *= xs[size_t(a)];
  for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int64_t(i), moved.push_back(xs[size_t(perm[i])]);
  flat.push_back(reduced);
  Value rows = g.reshape(g.transpose(x, perm), flat);
  Value last = g.scalar(g.builder().getI64Type(), double(flat.size() - 1));
  auto running = [&](int64_t reverse) {
    return g.make<CumProdOp>({rows, last}, {g.attr("exclusive", int64_t(1)), g.attr("reverse", reverse)});
  };
  Value others = g.transpose(g.reshape(g.mul(running(0), running(1)), moved), inverse);
  dx[0] = g.mul(g.broadcastTo(dy[0], x.getType(), axes), others);
  return success();
}

// A running sum's gradient is the running sum of dy the other way.
LogicalResult cumSumVJP(CumSumOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.make<CumSumOp>({dy[0], op.getRhs()}, {g.attr("exclusive", op.getExclusive().value_or(0)),
                                                  g.attr("reverse", int64_t(!op.getReverse().value_or(0)))});
  return success();
}

} // namespace

void attachReductionVJPs(MLIRContext *ctx) {
  attachVJP<ReduceSumOp, reduceVJP<ReduceSumOp, false>>(ctx);
  attachVJP<ReduceMeanOp, reduceVJP<ReduceMeanOp, true>>(ctx);
  attachVJP<ReduceL2Op, reduceL2VJP>(ctx);
  attachVJP<ReduceL1Op, reduceL1VJP>(ctx);
  attachVJP<ReduceSumSquareOp, reduceSumSquareVJP>(ctx);
  attachVJP<ReduceLogSumExpOp, reduceLogSumExpVJP>(ctx);
  attachVJP<ReduceMaxOp, reduceExtremeVJP<ReduceMaxOp>>(ctx);
  attachVJP<ReduceMinOp, reduceExtremeVJP<ReduceMinOp>>(ctx);
  attachVJP<ReduceLogSumOp, reduceLogSumVJP>(ctx);
  attachVJP<ReduceProdOp, reduceProdVJP>(ctx);
  attachVJP<CumSumOp, cumSumVJP>(ctx);
}

} // namespace sd::ir
