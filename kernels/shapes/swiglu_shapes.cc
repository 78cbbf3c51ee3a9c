// Shape rules of SwiGLU(gate, up) -> y and SwiGLUGrad(dy, gate, up) ->
// (d gate, d up): every operand and result has gate's shape and type; and of
// their packed forms, gate and up the two halves of x's last axis.
#include "shape_util.h"

namespace sd {

static Status sameAsGate(ShapeContext &c, size_t gateIndex, const char *op, size_t results) {
  const TensorInfo &gate = c.inputs[gateIndex];
  SD_CHECK_ARG(dtypeIsFloat(gate.dtype), op, " expects float operands");
  for (const TensorInfo &t : c.inputs) {
    SD_CHECK_ARG(t.dtype == gate.dtype, op, "'s operands must share one type");
    if (!t.rankKnown || !gate.rankKnown) continue;
    SD_CHECK_ARG(t.rank() == gate.rank(), op, "'s operands differ in shape: ", formatDims(t.dims), " and ",
                 formatDims(gate.dims));
    for (size_t i = 0; i < t.dims.size(); ++i)
      SD_CHECK_ARG(t.dims[i] < 0 || gate.dims[i] < 0 || t.dims[i] == gate.dims[i], op,
                   "'s operands differ in shape: ", formatDims(t.dims), " and ", formatDims(gate.dims));
  }
  c.outputs.assign(results, gate);
  return Status::ok();
}

// SwiGLUPacked(x [..., 2F]) -> y [..., F]; SwiGLUPackedGrad(dy [..., F], x) -> dx like x.
static Status packedShape(ShapeContext &c, bool grad) {
  const TensorInfo &x = c.inputs[grad ? 1 : 0];
  const char *op = grad ? "SwiGLUPackedGrad" : "SwiGLUPacked";
  SD_CHECK_ARG(dtypeIsFloat(x.dtype), op, " expects float operands");
  SD_CHECK_ARG(!x.rankKnown || x.rank() >= 1, op, " takes [..., 2F], got a scalar");
  TensorInfo y = x;
  if (x.rankKnown && x.dims.back() >= 0) {
    SD_CHECK_ARG(x.dims.back() % 2 == 0, op, ": the last axis holds gate and up, so its size must be even, got ",
                 formatDims(x.dims));
    y.dims.back() /= 2;
  }
  if (grad) {
    const TensorInfo &dy = c.inputs[0];
    SD_CHECK_ARG(dy.dtype == x.dtype, op, "'s operands must share one type");
    SD_CHECK_ARG(!dy.isStatic() || !y.isStatic() || dy.dims == y.dims, op, ": gradient ", formatDims(dy.dims),
                 " is not ", formatDims(y.dims));
    c.outputs = {x};
  } else {
    c.outputs = {y};
  }
  return Status::ok();
}

void registerSwiGLUShapes() {
  registerShapeRule("SwiGLU", [](ShapeContext &c) { return sameAsGate(c, 0, "SwiGLU", 1); });
  registerShapeRule("SwiGLUGrad", [](ShapeContext &c) { return sameAsGate(c, 1, "SwiGLUGrad", 2); });
  registerShapeRule("SwiGLUPacked", [](ShapeContext &c) { return packedShape(c, false); });
  registerShapeRule("SwiGLUPackedGrad", [](ShapeContext &c) { return packedShape(c, true); });
}

} // namespace sd
