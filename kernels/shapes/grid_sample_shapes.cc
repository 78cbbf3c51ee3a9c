// Shape rule of GridSample (opsets 16 and 20): X [N, C, D1..Dk] sampled at
// grid [N, H1..Hk, k] gives [N, C, H1..Hk].
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

void registerGridSampleShapes() { registerShapeRule("GridSample", gridSampleShape); }

} // namespace sd
