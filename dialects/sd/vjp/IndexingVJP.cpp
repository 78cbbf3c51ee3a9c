// Reverse-mode rules of the ops that move data by index: Gather,
// GatherElements, GatherND, ScatterElements, ScatterND and TopK. A gather's
// gradient scatter-adds dy back where each element came from, a scatter's
// gathers it; every scatter here sums its updates in order on every backend
// (no float atomics), so replay equals eager.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

NamedAttribute reductionAdd(GradBuilder &g) {
  return g.builder().getNamedAttr("reduction", g.builder().getStringAttr("add"));
}

LogicalResult gatherVJP(GatherOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  ArrayRef<int64_t> ds = shapeOf(op.getLhs());
  int64_t axis = axisOf(op.getAxis(), int64_t(ds.size()));
  dx[0] = g.make<GatherGradOp>({dy[0], op.getRhs()}, {g.attr("axis", axis), g.attr("data_shape", ds)});
  return success();
}

// torch.gather: dy added back where each element came from.
LogicalResult gatherElementsVJP(GatherElementsOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                                Grads &dx) {
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"axis"});
  attrs.push_back(reductionAdd(g));
  dx[0] = g.make<ScatterElementsOp>({g.zeros(op.getLhs().getType()), op.getRhs(), dy[0]}, attrs);
  return success();
}

// x[i, j] with index tensors (advanced indexing): the same, through ScatterND.
LogicalResult gatherNDVJP(GatherNDOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (op.getBatchDims().value_or(0) != 0) return op.emitError("GatherND with batch_dims is not differentiable yet");
  dx[0] = g.make<ScatterNDOp>({g.zeros(op.getLhs().getType()), op.getRhs(), dy[0]}, {reductionAdd(g)});
  return success();
}

// Scatter (none or add): the updates get dy where they landed; the data gets
// dy, less where an update overwrote it (reduction none). As in PyTorch,
// every update gets its gradient, even one a later duplicate overwrote.
template <typename ScatterT, typename GatherT>
LogicalResult scatterVJP(ScatterT op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  StringRef reduction = op.getReduction().value_or("none");
  if (reduction != "none" && reduction != "add")
    return op.emitError("a scatter with reduction '") << reduction << "' is not differentiable (none and add are)";
  if (need[0])
    dx[0] = reduction == "add" ? dy[0]
                               : g.make<ScatterT>({dy[0], op.getIndices(), g.zeros(op.getUpdates().getType())},
                                                  g.attrsOf(op, {"axis"}));
  if (need[2]) dx[2] = g.make<GatherT>({dy[0], op.getIndices()}, g.attrsOf(op, {"axis"}));
  return success();
}

// TopK's values (a router's top-k probabilities): dy back at the chosen
// indices, which are distinct along the axis.
LogicalResult topKVJP(TopKOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (!op.getIndices()) return op.emitError("TopK without its indices result is not differentiable");
  if (!dy[0]) return success();
  int64_t axis = op.getAxis().value_or(-1);
  dx[0] = g.make<ScatterElementsOp>({g.zeros(op.getX().getType()), op.getIndices(), dy[0]}, {g.attr("axis", axis)});
  return success();
}

} // namespace

void attachIndexingVJPs(MLIRContext *ctx) {
  attachVJP<GatherOp, gatherVJP>(ctx);
  attachVJP<GatherElementsOp, gatherElementsVJP>(ctx);
  attachVJP<GatherNDOp, gatherNDVJP>(ctx);
  attachVJP<ScatterElementsOp, scatterVJP<ScatterElementsOp, GatherElementsOp>>(ctx);
  attachVJP<ScatterNDOp, scatterVJP<ScatterNDOp, GatherNDOp>>(ctx);
  attachVJP<TopKOp, topKVJP>(ctx);
}

} // namespace sd::ir
