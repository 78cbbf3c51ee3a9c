// Reverse-mode rules of the data-movement ops (reshapes, Transpose, Split,
// Concat, Slice, Expand, Tile, Pad, Trilu, DepthToSpace, SpaceToDepth).
// Index-driven movement (gathers, scatters, TopK) is in IndexingVJP.cpp,
// interpolation (Resize, GridSample) in SamplingVJP.cpp.
#include "GradBuilder.h"
#include <algorithm>
#include <limits>

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

Value reversed(GradBuilder &g, Value v, int64_t axis) {
  return g.sliceAxis(v, axis, -1, std::numeric_limits<int64_t>::min(), -1);
}

// Slice: dy padded with zeros back to the input; a step k > 1 spreads it
// with k - 1 zeros between elements, a negative step reverses it first.
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
    int64_t k = steps.empty() ? 1 : steps[i];
    int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i], dim = xs[size_t(a)], n = ys[size_t(a)];
    int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
    s = std::clamp<int64_t>(s, 0, k < 0 ? dim - 1 : dim);
    if (k < 0 && n > 0) {
      // x[s::-|k|] (torch.flip, x[::-1]): dy reversed is x[low::|k|], low the
      // last element taken.
      if (n > 1) d = reversed(g, d, a);
      s += (n - 1) * k;
      k = -k;
    }
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

// One padded axis's adjoint (n elements of x, l and r padded before and
// after): the window of dy over x, plus what each mode copied from x added
// back where it came from: edge, each side's sum onto the end element;
// reflect, each side reversed onto x[1..l] and x[n-1-r..n-2]; wrap, each
// side onto the far end. A negative pad (constant mode) crops: the cropped
// elements of x get zeros.
Value padAxisAdjoint(GradBuilder &g, Value d, int64_t a, int64_t n, int64_t l, int64_t r, StringRef mode) {
  if (mode == "constant") {
    int64_t cropL = std::max<int64_t>(-l, 0), cropR = std::max<int64_t>(-r, 0), lead = std::max<int64_t>(l, 0);
    return g.padAxis(g.sliceAxis(d, a, lead, lead + n - cropL - cropR), a, cropL, cropR);
  }
  Value dx = g.sliceAxis(d, a, l, l + n);
  Value before = l > 0 ? g.sliceAxis(d, a, 0, l) : Value(), after = r > 0 ? g.sliceAxis(d, a, l + n, l + n + r) : Value();
  auto addAt = [&](Value part, int64_t lead, int64_t trail) { dx = g.add(dx, g.padAxis(part, a, lead, trail)); };
  if (mode == "edge") {
    if (before) addAt(g.reduceSum(before, {a}, true), 0, n - 1);
    if (after) addAt(g.reduceSum(after, {a}, true), n - 1, 0);
  } else if (mode == "reflect") {
    if (before) addAt(l > 1 ? reversed(g, before, a) : before, 1, n - 1 - l);
    if (after) addAt(r > 1 ? reversed(g, after, a) : after, n - 1 - r, 1);
  } else { // wrap
    if (before) addAt(before, n - l, 0);
    if (after) addAt(after, 0, n - r);
  }
  return dx;
}

// Pad (every mode): one axis at a time, as each mode pads each axis by its
// own index map.
LogicalResult padVJP(PadOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  StringRef mode = op.getMode().value_or("constant");
  ArrayRef<int64_t> xs = shapeOf(op.getData());
  int64_t rank = int64_t(xs.size());
  SmallVector<int64_t> pads, axes;
  if (!constantInts(op.getPads(), pads)) return op.emitError("Pad with run-time pads is not differentiable");
  if (op.getAxes() && !isa<NoneType>(op.getAxes().getType())) {
    if (!constantInts(op.getAxes(), axes)) return op.emitError("Pad with run-time axes is not differentiable");
  } else {
    for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  }
  Value d = dy[0];
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t a = axes[k] < 0 ? axes[k] + rank : axes[k], n = xs[size_t(a)];
    int64_t l = pads[k], r = pads[k + axes.size()];
    if (l == 0 && r == 0) continue;
    if (mode != "constant" && (l < 0 || r < 0))
      return op.emitError("Pad in mode '") << mode << "' with negative pads is not differentiable";
    if ((mode == "reflect" && (l >= n || r >= n)) || (mode == "wrap" && (l > n || r > n)))
      return op.emitError("Pad in mode '") << mode << "' wider than its axis " << a << " (" << n
                                           << ") is not differentiable";
    if (mode != "constant" && mode != "edge" && mode != "reflect" && mode != "wrap")
      return op.emitError("Pad in mode '") << mode << "' is not differentiable";
    d = padAxisAdjoint(g, d, a, n, l, r, mode);
  }
  dx[0] = d;
  return success();
}

// Trilu keeps a triangle: so does its gradient.
LogicalResult triluVJP(TriluOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  dx[0] = g.make<TriluOp>({dy[0], op.getK()}, g.attrsOf(op, {"upper"}));
  return success();
}

// DepthToSpace and SpaceToDepth are a reshape, a transpose and a reshape
// (ONNX's definitions); the gradient undoes them in reverse order.
Value unshuffled(GradBuilder &g, Value dy, ArrayRef<int64_t> split, ArrayRef<int64_t> perm, ArrayRef<int64_t> xs) {
  SmallVector<int64_t> permuted, inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    permuted.push_back(split[size_t(perm[i])]);
    inverse[size_t(perm[i])] = int64_t(i);
  }
  return g.reshape(g.transpose(g.reshape(dy, permuted), inverse), xs);
}

LogicalResult depthToSpaceVJP(DepthToSpaceOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                              Grads &dx) {
  ArrayRef<int64_t> xs = shapeOf(op.getInput());
  int64_t b = int64_t(op.getBlocksize()), n = xs[0], c = xs[1] / (b * b), h = xs[2], w = xs[3];
  if (op.getMode().value_or("DCR") == "CRD")
    dx[0] = unshuffled(g, dy[0], {n, c, b, b, h, w}, {0, 1, 4, 2, 5, 3}, xs);
  else
    dx[0] = unshuffled(g, dy[0], {n, b, b, c, h, w}, {0, 3, 4, 1, 5, 2}, xs);
  return success();
}

LogicalResult spaceToDepthVJP(SpaceToDepthOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                              Grads &dx) {
  ArrayRef<int64_t> xs = shapeOf(op.getInput());
  int64_t b = int64_t(op.getBlocksize()), n = xs[0], c = xs[1], h = xs[2] / b, w = xs[3] / b;
  dx[0] = unshuffled(g, dy[0], {n, c, h, b, w, b}, {0, 3, 5, 1, 2, 4}, xs);
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
  attachVJP<TriluOp, triluVJP>(ctx);
  attachVJP<DepthToSpaceOp, depthToSpaceVJP>(ctx);
  attachVJP<SpaceToDepthOp, spaceToDepthVJP>(ctx);
}

} // namespace sd::ir
