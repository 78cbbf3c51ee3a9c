// Reverse-mode rules of the interpolating samplers: Resize (ResizeGrad),
// GridSample (GridSampleGrad: dx and the grid's gradient in one kernel), and
// AffineGrid, which is linear in theta: its gradient is a product with the
// constant homogeneous coordinates of the output pixels.
#include "GradBuilder.h"
#include "sd/ops/math/grid_sample.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

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

LogicalResult gridSampleVJP(GridSampleOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (shapeOf(op.getLhs()).size() > 2 + size_t(math::kMaxGridGradDims))
    return op.emitError("GridSample over more than ") << math::kMaxGridGradDims << " spatial dims is not differentiable";
  Operation *grad = g.op<GridSampleGradOp>({dy[0], op.getLhs(), op.getRhs()},
                                           g.attrsOf(op, {"align_corners", "mode", "padding_mode"}), 2);
  if (!grad) return failure();
  for (unsigned i = 0; i < 2; ++i)
    if (need[i]) dx[i] = grad->getResult(i);
  return success();
}

// grid[b, p, r] = sum_j theta[b, r, j] · h[p, j], h the homogeneous
// coordinates (x, y[, z], 1) of output pixel p: dtheta[b] = dgrid[b]ᵀ · h.
LogicalResult affineGridVJP(AffineGridOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (!need[0]) return success();
  ArrayRef<int64_t> gs = shapeOf(op.getOutput());
  const int64_t k = gs.back(), n = gs[0];
  const bool align = op.getAlignCorners().value_or(0) != 0;
  int64_t points = 1;
  for (int64_t d = 1; d <= k; ++d) points *= gs[size_t(d)];
  SmallVector<float> h;
  for (int64_t p = 0; p < points; ++p) {
    // Coordinate j runs along spatial dim k-1-j (x is the last dim), as the kernels make it.
    for (int64_t j = 0, rest = p; j < k; ++j) {
      int64_t size = gs[size_t(k - j)];
      h.push_back(float(math::affineGridCoordinate(rest % size, size, align)));
      rest /= size;
    }
    h.push_back(1.0f);
  }
  auto type = RankedTensorType::get({points, k + 1}, g.builder().getF32Type());
  Value coords = g.builder().create<ConstantOp>(g.loc(), type, DenseElementsAttr::get(type, ArrayRef<float>(h)));
  coords = g.castTo(coords, elementTypeOf(dy[0]));
  Value rows = g.transpose(g.reshape(dy[0], {n, points, k}), {0, 2, 1});
  dx[0] = g.make<MatMulOp>({rows, coords});
  return success();
}

} // namespace

void attachSamplingVJPs(MLIRContext *ctx) {
  attachVJP<ResizeOp, resizeVJP>(ctx);
  attachVJP<GridSampleOp, gridSampleVJP>(ctx);
  attachVJP<AffineGridOp, affineGridVJP>(ctx);
}

} // namespace sd::ir
