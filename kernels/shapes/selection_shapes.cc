// Shape rules of NonZero, Compress and Unique: their result sizes depend on
// operand values, which a plan's static buffers need at compile time.
#include "selection.h"
#include "shape_util.h"

namespace sd {
namespace {

Status needsValues(const ShapeContext &c, size_t i, const char *op, const char *operand) {
  SD_CHECK_ARG(c.constInput(i) != nullptr, op, "'s result size depends on the values of its ", operand,
               ", which are only known at run time; --bind the model inputs they come from");
  return Status::ok();
}

Status nonZeroShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(needsValues(c, 0, "NonZero", "input"));
  std::vector<int64_t> flat;
  SD_RETURN_IF_ERROR(selection::nonzero(*c.constInput(0), flat));
  c.outputs = {TensorInfo{DType::I64, {int64_t(c.inputs[0].dims.size()), int64_t(flat.size())}}};
  return Status::ok();
}

Status compressShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(needsValues(c, 1, "Compress", "condition"));
  const TensorInfo &x = c.inputs[0];
  bool hasAxis;
  int64_t axis;
  SD_RETURN_IF_ERROR(selection::optionalAxis(c.attrs, x.rank(), hasAxis, axis));
  int64_t extent = hasAxis ? x.dims[size_t(axis)] : x.numElements();
  SD_CHECK_ARG(extent >= 0, "Compress needs a static input shape");
  std::vector<int64_t> kept;
  SD_RETURN_IF_ERROR(selection::compressed(*c.constInput(1), extent, kept));
  TensorInfo out{x.dtype, {int64_t(kept.size())}};
  if (hasAxis) out.dims = x.dims, out.dims[size_t(axis)] = int64_t(kept.size());
  c.outputs = {out};
  return Status::ok();
}

Status uniqueShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(needsValues(c, 0, "Unique", "input"));
  const TensorInfo &x = c.inputs[0];
  bool hasAxis;
  int64_t axis;
  SD_RETURN_IF_ERROR(selection::optionalAxis(c.attrs, x.rank(), hasAxis, axis));
  selection::Unique u;
  SD_RETURN_IF_ERROR(selection::unique(*c.constInput(0), hasAxis, axis, c.attrs.getInt("sorted", 1) != 0, u));
  int64_t n = int64_t(u.first.size());
  TensorInfo y{x.dtype, {n}};
  if (hasAxis) y.dims = x.dims, y.dims[size_t(axis)] = n;
  c.outputs = {y, TensorInfo{DType::I64, {n}}, TensorInfo{DType::I64, {int64_t(u.inverse.size())}},
               TensorInfo{DType::I64, {n}}};
  return Status::ok();
}

} // namespace

void registerSelectionShapes() {
  registerShapeRule("NonZero", nonZeroShape);
  registerShapeRule("Compress", compressShape);
  registerShapeRule("Unique", uniqueShape);
}

} // namespace sd
