// Shape rule of NonMaxSuppression. How many boxes survive depends on the
// scores, which a plan only sees at run time, so the selection is sized for
// the most the op can keep, batches x classes x min(max_output_boxes_per_class,
// boxes), and a second, scalar result counts the rows the kernel filled.
// sd-bounded-extents makes every consumer honour that count (or refuses it),
// and the runtime hands the entry's caller only the counted rows.
#include "shape_util.h"
#include <algorithm>

namespace sd {

static Status nonMaxSuppressionShape(ShapeContext &c) {
  const TensorInfo &boxes = c.inputs[0], &scores = c.inputs[1];
  SD_CHECK_ARG(boxes.rank() == 3 && (boxes.dims[2] < 0 || boxes.dims[2] == 4),
               "NonMaxSuppression boxes must be [batches, boxes, 4], got ", formatDims(boxes.dims));
  SD_CHECK_ARG(scores.rank() == 3, "NonMaxSuppression scores must be [batches, classes, boxes], got ",
               formatDims(scores.dims));
  auto agree = [](int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; };
  SD_CHECK_ARG(agree(boxes.dims[0], scores.dims[0]) && agree(boxes.dims[1], scores.dims[2]),
               "NonMaxSuppression boxes ", formatDims(boxes.dims), " and scores ", formatDims(scores.dims),
               " disagree on batches or boxes");
  SD_CHECK_ARG(dtypeIsFloat(boxes.dtype) && boxes.dtype == scores.dtype,
               "NonMaxSuppression boxes and scores must be the same floating-point type");
  int64_t perClass = boxes.dims[1];
  std::vector<int64_t> maxOut;
  if (!c.hasInput(2)) perClass = 0; // ONNX's default: select nothing
  else if (c.constInts(2, maxOut) && maxOut.size() == 1 && perClass >= 0)
    perClass = std::clamp<int64_t>(maxOut[0], 0, perClass);
  int64_t bound = perClass;
  for (int64_t d : {scores.dims[0], scores.dims[1]}) bound = (bound < 0 || d < 0) ? (bound == 0 ? 0 : -1) : bound * d;
  c.outputs = {TensorInfo{DType::I64, {bound, 3}}, TensorInfo{DType::I64, {}}};
  return Status::ok();
}

void registerNonMaxSuppressionShapes() { registerShapeRule("NonMaxSuppression", nonMaxSuppressionShape); }

} // namespace sd
