// Shape rules of the ops that unrolled ONNX control flow leaves in a plan:
// IfSelect (an If whose condition is run-time data) and LoopGuard (a Loop
// bounded by --max-trip).
#include "shape_util.h"

namespace sd {

static Status singleBool(const TensorInfo &t, const char *what) {
  SD_CHECK_ARG(t.dtype == DType::Bool, what, " must be bool, got ", dtypeName(t.dtype));
  SD_CHECK_ARG(!t.isStatic() || t.numElements() == 1, what, " must hold one element, has ", formatDims(t.dims));
  return Status::ok();
}

// The taken branch's type when the condition is a constant; otherwise both
// branches must agree, because the plan's buffers have one static shape.
static Status ifSelectShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(singleBool(c.inputs[0], "If condition"));
  const TensorInfo &a = c.inputs[1], &b = c.inputs[2];
  if (const TensorView *cond = c.constInput(0)) {
    c.outputs = {*cond->as<uint8_t>() ? a : b};
    return Status::ok();
  }
  SD_CHECK_ARG(a.dtype == b.dtype, "If branches give different element types (", dtypeName(a.dtype), " and ",
               dtypeName(b.dtype), ")");
  auto mismatch = [&] {
    return sdError("If branches give different shapes (", formatDims(a.dims), " and ", formatDims(b.dims),
                   ") and the condition is only known at run time; --bind the inputs it depends on");
  };
  if (!a.rankKnown || !b.rankKnown) {
    c.outputs = {a.rankKnown ? a : b};
    return Status::ok();
  }
  if (a.dims.size() != b.dims.size()) return mismatch();
  TensorInfo out = a;
  for (size_t i = 0; i < a.dims.size(); ++i) {
    if (a.dims[i] >= 0 && b.dims[i] >= 0 && a.dims[i] != b.dims[i]) return mismatch();
    if (out.dims[i] < 0) out.dims[i] = b.dims[i];
  }
  c.outputs = {out};
  return Status::ok();
}

static Status loopGuardShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(singleBool(c.inputs[1], "LoopGuard overflow flag"));
  SD_CHECK_ARG(!c.attrs.getString("message", "").empty(), "LoopGuard needs a message");
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

void registerControlShapes() {
  registerShapeRule("IfSelect", ifSelectShape);
  registerShapeRule("LoopGuard", loopGuardShape);
}

} // namespace sd
