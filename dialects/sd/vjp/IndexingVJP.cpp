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
  Value grad = dy[0];
  if (auto row = op->getAttrOfType<IntegerAttr>(kPaddingRowAttr); row && axis == 0) {
    // nn.Embedding(padding_idx=row): where the index is the padding row, no gradient.
    Value indices = op.getRhs();
    Type it = cast<RankedTensorType>(indices.getType()).getElementType();
    Value padded = g.castTo(g.make<EqualOp>({indices, g.scalar(it, double(row.getInt()))}), elementTypeOf(grad));
    Value keep = g.sub(g.scalar(elementTypeOf(grad), 1.0), padded);
    SmallVector<int64_t> shape(shapeOf(indices));
    shape.append(ds.size() - 1, 1);
    grad = g.mul(grad, g.reshape(keep, shape));
  }
  dx[0] = g.make<GatherGradOp>({grad, op.getRhs()}, {g.attr("axis", axis), g.attr("data_shape", ds)});
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
// dy scatter-added back at the gathered positions. With batch_dims = b the
// index tuples count from each batch item's slice: they get the batch
// coordinates put in front ([b_1..b_b, i.., k] -> [b_1..b_b, i.., b + k]),
// which ScatterND, having no batch_dims, reads from the whole data.
LogicalResult gatherNDVJP(GatherNDOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value indices = op.getRhs();
  const int64_t batch = op.getBatchDims().value_or(0);
  if (batch > 0) {
    SmallVector<int64_t> is(shapeOf(indices));
    if (int64_t(is.size()) <= batch) return op.emitError("GatherND's indices need more dims than batch_dims");
    is.back() = batch;
    int64_t count = 1;
    for (int64_t d : is) count *= d;
    // Element (.., t) holds the coordinate of batch dim t.
    SmallVector<int64_t> coords(static_cast<size_t>(count));
    for (int64_t e = 0; e < count; ++e) {
      const int64_t t = e % batch;
      int64_t stride = batch;
      for (int64_t d = int64_t(is.size()) - 2; d > t; --d) stride *= is[size_t(d)];
      coords[size_t(e)] = (e / stride) % is[size_t(t)];
    }
    indices = g.make<ConcatOp>({g.ints(is, coords), indices}, {g.attr("axis", int64_t(is.size()) - 1)});
  }
  dx[0] = g.make<ScatterNDOp>({g.zeros(op.getLhs().getType()), indices, dy[0]}, {reductionAdd(g)});
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
