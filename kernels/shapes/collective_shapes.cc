// Shape rules of the collectives a data-parallel training plan holds.
#include "shape_util.h"

namespace sd {
namespace {

// AllReduce(x...) -> x... (each tensor summed over every rank),
// Broadcast(x...) -> x... (each tensor as the root holds it) and
// WaitCollectives(x...) -> x... (once the reductions started on them are
// complete). One dtype per step, so that a run of adjacent tensors goes out
// as one message.
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

constexpr char kAllReduce[] = "AllReduce", kBroadcast[] = "Broadcast", kReduceToOwner[] = "ReduceToOwner",
               kWaitCollectives[] = "WaitCollectives";

// AllGatherRows(shard) -> the whole tensor; the IR types both as the whole
// (only the run-time buffers differ), so the shape is the operand's.
Status allGatherRowsShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs.size() == 1 && c.numOutputs == 1, "AllGatherRows takes one tensor and gives one");
  SD_CHECK_ARG(!c.inputs[0].dims.empty(), "AllGatherRows gathers rows: a 0-d tensor has none");
  c.outputs = c.inputs;
  return Status::ok();
}

// ReduceScatterRows(acc, delta) -> acc's shape; delta is the whole tensor acc is rows of.
Status reduceScatterRowsShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs.size() == 2 && c.numOutputs == 1, "ReduceScatterRows takes (acc, delta) and gives one tensor");
  const TensorInfo &acc = c.inputs[0], &delta = c.inputs[1];
  SD_CHECK_ARG(acc.dtype == delta.dtype && acc.dims == delta.dims, "ReduceScatterRows: acc ", dtypeName(acc.dtype), "[",
               formatDims(acc.dims), "] and delta ", dtypeName(delta.dtype), "[", formatDims(delta.dims),
               "] differ");
  SD_CHECK_ARG(!acc.dims.empty(), "ReduceScatterRows scatters rows: a 0-d tensor has none");
  c.outputs = {acc};
  return Status::ok();
}

} // namespace

void registerCollectiveShapes() {
  registerShapeRule(kAllReduce, collectiveShape<kAllReduce>);
  registerShapeRule(kBroadcast, collectiveShape<kBroadcast>);
  registerShapeRule(kReduceToOwner, collectiveShape<kReduceToOwner>);
  registerShapeRule(kWaitCollectives, collectiveShape<kWaitCollectives>);
  registerShapeRule("AllGatherRows", allGatherRowsShape);
  registerShapeRule("ReduceScatterRows", reduceScatterRowsShape);
}

} // namespace sd
