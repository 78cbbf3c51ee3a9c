// Reverse-mode rules of the data-movement ops (reshapes, Transpose, Split,
// Concat, Slice, Expand, Tile, Pad, Gather, GatherElements) and of Resize.
#include "GradBuilder.h"
#include <algorithm>

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

template <typename OpT>
LogicalResult reshapeLikeVJP(OpT op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.reshape(dy[0], shapeOf(op->getOperand(0)));
  return success();
}

LogicalResult transposeVJP(TransposeOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  int64_t r = int64_t(shapeOf(op.getInput()).size());
  SmallVector<int64_t> perm, inverse(size_t(r), 0);
  if (auto p = op.getPerm()) perm.assign(p->begin(), p->end());
  else
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  for (int64_t i = 0; i < r; ++i) inverse[size_t(perm[size_t(i)])] = i;
  dx[0] = g.transpose(dy[0], inverse);
  return success();
}

int64_t axisOf(std::optional<int64_t> a, int64_t rank) {
  int64_t v = a.value_or(0);
  return v < 0 ? v + rank : v;
}

// Split's pieces, with zeros for the ones that got no gradient, concatenated back.
LogicalResult splitVJP(SplitOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  int64_t axis = axisOf(op.getAxis(), int64_t(shapeOf(op.getInput()).size()));
  SmallVector<Value> parts;
  for (auto [r, d] : llvm::zip(op.getResults(), dy)) parts.push_back(d ? d : g.zeros(r.getType()));
  dx[0] = g.make<ConcatOp>(parts, {g.attr("axis", axis)});
  return success();
}

LogicalResult concatVJP(ConcatOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  // I64Attr's getter is unsigned: a negative axis (PyTorch's torch.cat(..., -1)) must be read as signed.
  int64_t axis = int64_t(op.getAxis());
  if (axis < 0) axis += int64_t(shapeOf(dy[0]).size());
  SmallVector<int64_t> sizes;
  for (Value v : op.getInputs()) sizes.push_back(shapeOf(v)[size_t(axis)]);
  Operation *split = g.op<SplitOp>({dy[0], g.ints(sizes)}, {g.attr("axis", axis)}, unsigned(sizes.size()));
  if (!split) return failure();
  for (size_t i = 0; i < sizes.size(); ++i)
    if (need[i]) dx[i] = split->getResult(unsigned(i));
  return success();
}

// Slice with unit steps: the gradient is dy padded with zeros back to the input.
LogicalResult sliceVJP(SliceOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  ArrayRef<int64_t> xs = shapeOf(op.getData());
  int64_t rank = int64_t(xs.size());
  SmallVector<int64_t> starts, ends, axes, steps;
  if (!constantInts(op.getStarts(), starts) || !constantInts(op.getEnds(), ends))
    return op.emitError("Slice with non-constant starts/ends is not differentiable");
  if (!isa<NoneType>(op.getAxes().getType()) && !constantInts(op.getAxes(), axes))
    return op.emitError("Slice with non-constant axes is not differentiable");
  if (!isa<NoneType>(op.getSteps().getType()) && !constantInts(op.getSteps(), steps))
    return op.emitError("Slice with non-constant steps is not differentiable");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  SmallVector<int64_t> pads(size_t(2 * rank), 0);
  ArrayRef<int64_t> ys = shapeOf(op.getResult());
  Value d = dy[0];
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t k = steps.empty() ? 1 : steps[i];
    if (k < 1) return op.emitError("Slice with negative steps is not differentiable yet");
    int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i], dim = xs[size_t(a)], n = ys[size_t(a)];
    int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
    s = std::clamp<int64_t>(s, 0, dim);
    int64_t kept = n;
    if (k > 1 && n > 0) {
      // Every k-th element (x[s::k], as an interleaved rotary's x[..., ::2]):
      // k - 1 zeros after each gradient element along the axis, cut to what
      // fits after s.
      SmallVector<int64_t> shape(shapeOf(d));
      SmallVector<int64_t> spread(size_t(2 * (rank + 1)), 0);
      spread[size_t(a + 1 + rank + 1)] = k - 1;
      d = g.make<PadOp>({g.make<UnsqueezeOp>({d, g.ints({a + 1})}), g.ints(spread), g.none(), g.none()});
      shape[size_t(a)] = n * k;
      d = g.reshape(d, shape);
      kept = std::min(n * k, dim - s);
      if (kept < n * k) d = g.make<SliceOp>({d, g.ints({0}), g.ints({kept}), g.ints({a}), g.none()});
    }
    pads[size_t(a)] = s;
    pads[size_t(a + rank)] = dim - s - kept;
  }
  dx[0] = g.make<PadOp>({d, g.ints(pads), g.none(), g.none()});
  return success();
}

LogicalResult expandVJP(ExpandOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.unbroadcast(dy[0], op.getLhs().getType());
  return success();
}

// y = x tiled r times per axis: dy viewed as [r0, d0, r1, d1, ...], summed
// over the repeats.
LogicalResult tileVJP(TileOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  SmallVector<int64_t> repeats;
  if (!constantInts(op.getRhs(), repeats)) return op.emitError("Tile with run-time repeats is not differentiable");
  ArrayRef<int64_t> xs = shapeOf(op.getLhs());
  SmallVector<int64_t> split, axes;
  for (size_t i = 0; i < xs.size(); ++i) {
    axes.push_back(int64_t(split.size()));
    split.push_back(repeats[i]);
    split.push_back(xs[i]);
  }
  dx[0] = g.reduceSum(g.reshape(dy[0], split), axes, false);
  return success();
}

// Constant padding: the gradient is the unpadded window of dy.
LogicalResult padVJP(PadOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (op.getMode().value_or("constant") != "constant")
    return op.emitError("Pad in mode '") << *op.getMode() << "' is not differentiable yet (constant padding is)";
  ArrayRef<int64_t> xs = shapeOf(op.getData());
  int64_t rank = int64_t(xs.size());
  SmallVector<int64_t> pads, axes;
  if (!constantInts(op.getPads(), pads)) return op.emitError("Pad with run-time pads is not differentiable");
  if (op.getAxes() && !isa<NoneType>(op.getAxes().getType())) {
    if (!constantInts(op.getAxes(), axes)) return op.emitError("Pad with run-time axes is not differentiable");
  } else {
    for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  }
  SmallVector<int64_t> starts, ends, sliced;
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t a = axes[k] < 0 ? axes[k] + rank : axes[k];
    if (pads[k] < 0 || pads[k + axes.size()] < 0)
      return op.emitError("Pad with negative pads (a crop) is not differentiable yet");
    sliced.push_back(a);
    starts.push_back(pads[k]);
    ends.push_back(pads[k] + xs[size_t(a)]);
  }
  dx[0] = g.make<SliceOp>({dy[0], g.ints(starts), g.ints(ends), g.ints(sliced), g.none()});
  return success();
}

LogicalResult gatherVJP(GatherOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  ArrayRef<int64_t> ds = shapeOf(op.getLhs());
  int64_t axis = axisOf(op.getAxis(), int64_t(ds.size()));
  dx[0] = g.make<GatherGradOp>({dy[0], op.getRhs()}, {g.attr("axis", axis), g.attr("data_shape", ds)});
  return success();
}

// torch.gather: dy added back where each element came from, by a
// ScatterElements with reduction add (deterministic on every backend: each
// output element sums its updates in order).
LogicalResult gatherElementsVJP(GatherElementsOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                                Grads &dx) {
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"axis"});
  attrs.push_back(g.builder().getNamedAttr("reduction", g.builder().getStringAttr("add")));
  dx[0] = g.make<ScatterElementsOp>({g.zeros(op.getLhs().getType()), op.getRhs(), dy[0]}, attrs);
  return success();
}

// Resize (F.interpolate): ResizeGrad, the interpolation's adjoint, with the
// forward's attributes, roi and scales (sizes are dy's shape).
LogicalResult resizeVJP(ResizeOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  SmallVector<NamedAttribute> attrs =
      g.attrsOf(op, {"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                     "keep_aspect_ratio_policy", "mode", "nearest_mode"});
  attrs.push_back(g.attr("input_shape", shapeOf(op.getX())));
  dx[0] = g.make<ResizeGradOp>({dy[0], op.getRoi(), op.getScales()}, attrs);
  return success();
}

} // namespace

void attachMovementVJPs(MLIRContext *ctx) {
  attachVJP<ReshapeOp, reshapeLikeVJP<ReshapeOp>>(ctx);
  attachVJP<FlattenOp, reshapeLikeVJP<FlattenOp>>(ctx);
  attachVJP<SqueezeOp, reshapeLikeVJP<SqueezeOp>>(ctx);
  attachVJP<UnsqueezeOp, reshapeLikeVJP<UnsqueezeOp>>(ctx);
  attachVJP<TransposeOp, transposeVJP>(ctx);
  attachVJP<SplitOp, splitVJP>(ctx);
  attachVJP<ConcatOp, concatVJP>(ctx);
  attachVJP<SliceOp, sliceVJP>(ctx);
  attachVJP<ExpandOp, expandVJP>(ctx);
  attachVJP<TileOp, tileVJP>(ctx);
  attachVJP<PadOp, padVJP>(ctx);
  attachVJP<GatherOp, gatherVJP>(ctx);
  attachVJP<GatherElementsOp, gatherElementsVJP>(ctx);
  attachVJP<ResizeOp, resizeVJP>(ctx);
}

} // namespace sd::ir
