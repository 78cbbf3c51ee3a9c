// Shape rule of RoiAlign: X [N, C, H, W], rois [R, 4], batch_indices [R]
// give [R, C, output_height, output_width].
#include "shape_util.h"

namespace sd {

static Status roiAlignShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &rois = c.inputs[1], &batch = c.inputs[2];
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "mode", {"avg", "max"}));
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "coordinate_transformation_mode", {"half_pixel", "output_half_pixel"}));
  SD_CHECK_ARG(dtypeIsFloat(x.dtype) && x.rank() == 4, "RoiAlign X must be a float [N, C, H, W]");
  SD_CHECK_ARG(rois.dtype == x.dtype && rois.rank() == 2 && (rois.dims[1] < 0 || rois.dims[1] == 4),
               "RoiAlign rois must be [num_rois, 4] of X's type");
  SD_CHECK_ARG(dtypeIsInteger(batch.dtype) && batch.rank() == 1, "RoiAlign batch_indices must be 1-D integers");
  SD_CHECK_ARG(rois.dims[0] < 0 || batch.dims[0] < 0 || rois.dims[0] == batch.dims[0],
               "RoiAlign rois and batch_indices differ in length");
  int64_t h = c.attrs.getInt("output_height", 1), w = c.attrs.getInt("output_width", 1);
  SD_CHECK_ARG(h > 0 && w > 0, "RoiAlign output_height and output_width must be positive");
  c.outputs = {TensorInfo{x.dtype, {rois.dims[0], x.dims[1], h, w}}};
  return Status::ok();
}

void registerRoiAlignShapes() { registerShapeRule("RoiAlign", roiAlignShape); }

} // namespace sd
