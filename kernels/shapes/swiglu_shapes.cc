// Shape rules of SwiGLU(gate, up) -> y and SwiGLUGrad(dy, gate, up) ->
// (d gate, d up): every operand and result has gate's shape and type.
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

void registerSwiGLUShapes() {
  registerShapeRule("SwiGLU", [](ShapeContext &c) { return sameAsGate(c, 0, "SwiGLU", 1); });
  registerShapeRule("SwiGLUGrad", [](ShapeContext &c) { return sameAsGate(c, 1, "SwiGLUGrad", 2); });
}

} // namespace sd
