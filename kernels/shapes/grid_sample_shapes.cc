// Shape rules of GridSample (opsets 16 and 20): X [N, C, D1..Dk] sampled at
// grid [N, H1..Hk, k] gives [N, C, H1..Hk]; of its gradient; and of
// AffineGrid, which makes grids.
#include "shape_util.h"

namespace sd {

static Status gridSampleShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &grid = c.inputs[1];
  int64_t k = x.rank() - 2;
  SD_CHECK_ARG(k >= 1 && grid.rank() == k + 2, "GridSample takes X [N, C, D1..Dk] and grid [N, H1..Hk, k], got ",
               formatDims(x.dims), " and ", formatDims(grid.dims));
  SD_CHECK_ARG(grid.dims.back() < 0 || grid.dims.back() == k, "GridSample grid's last dim must be ", k, ", got ",
               grid.dims.back());
  SD_CHECK_ARG(x.dims[0] < 0 || grid.dims[0] < 0 || x.dims[0] == grid.dims[0], "GridSample X and grid batch differ");
  SD_CHECK_ARG(dtypeIsFloat(grid.dtype), "GridSample grid must be floating point");
  std::string mode = c.attrs.getString("mode", "linear"), padding = c.attrs.getString("padding_mode", "zeros");
  SD_CHECK_ARG(mode == "linear" || mode == "bilinear" || mode == "nearest" || mode == "cubic" || mode == "bicubic",
               "GridSample mode '", mode, "' is not linear, nearest or cubic");
  SD_CHECK_ARG(padding == "zeros" || padding == "border" || padding == "reflection", "GridSample padding_mode '",
               padding, "' is not zeros, border or reflection");
  TensorInfo out{x.dtype, {x.dims[0], x.dims[1]}};
  for (int64_t d = 1; d <= k; ++d) out.dims.push_back(grid.dims[size_t(d)]);
  c.outputs = {out};
  return Status::ok();
}

// GridSampleGrad(dy, X, grid) -> (dx, dgrid): X's and grid's shapes; dy
// must be what GridSample(X, grid) gives.
static Status gridSampleGradShape(ShapeContext &c) {
  const TensorInfo &dy = c.inputs[0], &x = c.inputs[1], &grid = c.inputs[2];
  ShapeContext forward = c;
  forward.inputs = {x, grid};
  forward.constInputs = {};
  SD_RETURN_IF_ERROR(gridSampleShape(forward));
  SD_CHECK_ARG(dy.dtype == x.dtype && dy.dims == forward.outputs[0].dims, "GridSampleGrad: the gradient ",
               formatDims(dy.dims), " does not match GridSample's result ", formatDims(forward.outputs[0].dims));
  c.outputs = {x, grid};
  return Status::ok();
}

// AffineGrid: theta [N, 2, 3] with size (N, C, H, W) gives [N, H, W, 2];
// theta [N, 3, 4] with size (N, C, D, H, W) gives [N, D, H, W, 3].
static Status affineGridShape(ShapeContext &c) {
  const TensorInfo &theta = c.inputs[0];
  SD_CHECK_ARG(dtypeIsFloat(theta.dtype) && theta.rank() == 3, "AffineGrid theta must be a float [N, 2, 3] or "
               "[N, 3, 4]");
  std::vector<int64_t> size;
  if (!c.constInts(1, size)) {
    c.outputs = {unknownRank(theta.dtype)};
    return Status::ok();
  }
  SD_CHECK_ARG(size.size() == 4 || size.size() == 5, "AffineGrid size must be (N, C, H, W) or (N, C, D, H, W)");
  int64_t k = int64_t(size.size()) - 2;
  SD_CHECK_ARG((theta.dims[1] < 0 || theta.dims[1] == k) && (theta.dims[2] < 0 || theta.dims[2] == k + 1) &&
               (theta.dims[0] < 0 || theta.dims[0] == size[0]), "AffineGrid theta ", formatDims(theta.dims),
               " does not fit size ", formatDims(size));
  TensorInfo out{theta.dtype, {size[0]}};
  for (size_t d = 2; d < size.size(); ++d) {
    SD_CHECK_ARG(size[d] > 0, "AffineGrid sizes must be positive");
    out.dims.push_back(size[d]);
  }
  out.dims.push_back(k);
  c.outputs = {out};
  return Status::ok();
}

void registerGridSampleShapes() {
  registerShapeRule("GridSample", gridSampleShape);
  registerShapeRule("GridSampleGrad", gridSampleGradShape);
  registerShapeRule("AffineGrid", affineGridShape);
}

} // namespace sd
