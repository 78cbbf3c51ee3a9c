// Shape rules of the collectives a data-parallel training plan holds.
#include "shape_util.h"

namespace sd {
namespace {

// AllReduce(x...) -> x... (each tensor summed over every rank) and
// Broadcast(x...) -> x... (each tensor as the root holds it). One dtype per
// step, so that a run of adjacent tensors goes out as one message.
template <const char *Op> Status collectiveShape(ShapeContext &c) {
  SD_CHECK_ARG(!c.inputs.empty(), Op, " takes at least one tensor");
  SD_CHECK_ARG(c.numOutputs == c.inputs.size(), Op, " has one result per operand: ", c.inputs.size(), " operands, ",
               c.numOutputs, " results");
  for (const TensorInfo &t : c.inputs)
    SD_CHECK_ARG(t.dtype == c.inputs[0].dtype, Op, " operands share one element type: ", dtypeName(t.dtype), " and ",
                 dtypeName(c.inputs[0].dtype));
  c.outputs = c.inputs;
  return Status::ok();
}

constexpr char kAllReduce[] = "AllReduce", kBroadcast[] = "Broadcast", kReduceToOwner[] = "ReduceToOwner";

} // namespace

void registerCollectiveShapes() {
  registerShapeRule(kAllReduce, collectiveShape<kAllReduce>);
  registerShapeRule(kBroadcast, collectiveShape<kBroadcast>);
  registerShapeRule(kReduceToOwner, collectiveShape<kReduceToOwner>);
}

} // namespace sd
