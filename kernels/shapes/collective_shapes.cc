// Shape rules of the collectives a data-parallel training plan holds.
#include "shape_util.h"

namespace sd {
namespace {

// AllReduce(x...) -> x...: each tensor summed over every rank. One dtype per
// step, so that a run of adjacent tensors goes out as one message.
Status allReduceShape(ShapeContext &c) {
  SD_CHECK_ARG(!c.inputs.empty(), "AllReduce takes at least one tensor");
  SD_CHECK_ARG(c.numOutputs == c.inputs.size(), "AllReduce has one result per operand: ", c.inputs.size(),
               " operands, ", c.numOutputs, " results");
  for (const TensorInfo &t : c.inputs)
    SD_CHECK_ARG(t.dtype == c.inputs[0].dtype, "AllReduce operands share one element type: ", dtypeName(t.dtype),
                 " and ", dtypeName(c.inputs[0].dtype));
  c.outputs = c.inputs;
  return Status::ok();
}

} // namespace

void registerCollectiveShapes() { registerShapeRule("AllReduce", allReduceShape); }

} // namespace sd
