// Shape rules of the ops ONNX control flow leaves in a plan: IfSelect (an If
// whose condition is run-time data), LoopGuard (an unrolled Loop bounded by
// --max-trip) and Loop (a loop step over a body entry).
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

// Loop(M, cond, carried..., invariants...) -> (carried..., scans...). The
// carried values keep their types; a scan output's slice type is the body
// entry's, which only the plan (Plan::parse) and the importer see: it is left
// unknown here, and the compiler never re-derives a Loop's result types.
static Status loopShape(ShapeContext &c) {
  const int64_t carried = c.attrs.getInt("carried", -1), trips = c.attrs.getInt("max_trips", -1);
  SD_CHECK_ARG(carried >= 0 && size_t(carried) + 2 <= c.inputs.size(), "Loop carries ", carried, " values but has ",
               c.inputs.size(), " operands");
  SD_CHECK_ARG(size_t(carried) <= c.numOutputs, "Loop carries ", carried, " values but has ", c.numOutputs, " results");
  SD_CHECK_ARG(trips >= 0, "Loop needs max_trips >= 0, got ", trips);
  SD_CHECK_ARG(!c.attrs.getString("body", "").empty(), "Loop needs a body entry");
  SD_CHECK_ARG(c.inputs[0].dtype == DType::I64 && (!c.inputs[0].isStatic() || c.inputs[0].numElements() == 1),
               "Loop trip count must be one int64");
  SD_RETURN_IF_ERROR(singleBool(c.inputs[1], "Loop condition"));
  c.outputs.assign(c.inputs.begin() + 2, c.inputs.begin() + 2 + carried);
  TensorInfo unknown;
  unknown.rankKnown = false;
  c.outputs.resize(c.numOutputs, unknown);
  return Status::ok();
}

// If(cond, then inputs..., else inputs...) -> the taken body's outputs, typed
// by the body entries (checked by Plan::parse against both), so unknown here.
static Status ifShape(ShapeContext &c) {
  const int64_t thenInputs = c.attrs.getInt("then_inputs", -1);
  SD_CHECK_ARG(thenInputs >= 0 && size_t(thenInputs) + 1 <= c.inputs.size(), "If passes ", thenInputs,
               " values to its then body but has ", c.inputs.size(), " operands");
  SD_CHECK_ARG(!c.attrs.getString("then_body", "").empty() && !c.attrs.getString("else_body", "").empty(),
               "If needs a then body and an else body entry");
  SD_RETURN_IF_ERROR(singleBool(c.inputs[0], "If condition"));
  TensorInfo unknown;
  unknown.rankKnown = false;
  c.outputs.assign(c.numOutputs, unknown);
  return Status::ok();
}

void registerControlShapes() {
  registerShapeRule("If", ifShape);
  registerShapeRule("Loop", loopShape);
  registerShapeRule("IfSelect", ifSelectShape);
  registerShapeRule("LoopGuard", loopGuardShape);
}

} // namespace sd
