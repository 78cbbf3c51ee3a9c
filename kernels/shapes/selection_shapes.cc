// Shape rules of NonZero, Compress and Unique. Their result sizes depend on
// operand values: where those are constants (or --bind values) the results
// are exact; otherwise they are sized for the most the op can select, and
// the last result counts the slices the kernel filled (see nms_shapes.cc and
// sd-bounded-extents). Either way that count is a result of its own.
#include "selection.h"
#include "shape_util.h"
#include <algorithm>

namespace sd {
namespace {

const TensorInfo kCount{DType::I64, {}};

Status nonZeroShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  int64_t n = x.numElements(); // the bound: every element
  if (c.constInput(0)) {
    std::vector<int64_t> flat;
    SD_RETURN_IF_ERROR(selection::nonzero(*c.constInput(0), flat));
    n = int64_t(flat.size());
  }
  c.outputs = {TensorInfo{DType::I64, {x.rank(), n}}, kCount};
  return Status::ok();
}

Status compressShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &cond = c.inputs[1];
  bool hasAxis;
  int64_t axis;
  SD_RETURN_IF_ERROR(selection::optionalAxis(c.attrs, x.rank(), hasAxis, axis));
  int64_t extent = hasAxis ? x.dims[size_t(axis)] : x.numElements();
  SD_CHECK_ARG(cond.rank() == 1, "Compress condition must be 1-D, got ", formatDims(cond.dims));
  int64_t n = extent < 0 || cond.dims[0] < 0 ? kUnknownDim : std::min(extent, cond.dims[0]);
  if (c.constInput(1) && extent >= 0) {
    std::vector<int64_t> kept;
    SD_RETURN_IF_ERROR(selection::compressed(*c.constInput(1), extent, kept));
    n = int64_t(kept.size());
  }
  TensorInfo out{x.dtype, {n}};
  if (hasAxis) out.dims = x.dims, out.dims[size_t(axis)] = n;
  c.outputs = {out, kCount};
  return Status::ok();
}

Status uniqueShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  bool hasAxis;
  int64_t axis;
  SD_RETURN_IF_ERROR(selection::optionalAxis(c.attrs, x.rank(), hasAxis, axis));
  int64_t extent = hasAxis ? x.dims[size_t(axis)] : x.numElements(), n = extent;
  if (c.constInput(0)) {
    selection::Unique u;
    SD_RETURN_IF_ERROR(selection::unique(*c.constInput(0), hasAxis, axis, c.attrs.getInt("sorted", 1) != 0, u));
    n = int64_t(u.first.size());
  }
  TensorInfo y{x.dtype, {n}};
  if (hasAxis) y.dims = x.dims, y.dims[size_t(axis)] = n;
  c.outputs = {y, TensorInfo{DType::I64, {n}}, TensorInfo{DType::I64, {extent}}, TensorInfo{DType::I64, {n}}, kCount};
  return Status::ok();
}

} // namespace

void registerSelectionShapes() {
  registerShapeRule("NonZero", nonZeroShape);
  registerShapeRule("Compress", compressShape);
  registerShapeRule("Unique", uniqueShape);
}

} // namespace sd
