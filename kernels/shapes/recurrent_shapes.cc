// Shape rules of Recurrence (one direction of an ONNX RNN/GRU/LSTM after its
// input projection) and RecurrenceGrad.
#include "sd/ops/recurrent_layout.h"
#include "shape_util.h"
#include <algorithm>

namespace sd {
namespace {

using namespace recurrent;

bool agrees(int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; }

Status checkDims(const ShapeContext &c, size_t i, const char *what, const Dims &want) {
  if (!c.hasInput(i) || !c.inputs[i].rankKnown) return Status::ok();
  const Dims &d = c.inputs[i].dims;
  bool ok = d.size() == want.size();
  for (size_t k = 0; ok && k < d.size(); ++k) ok = agrees(d[k], want[k]);
  SD_CHECK_ARG(ok, what, " is ", formatDims(d), ", expected ", formatDims(want));
  return Status::ok();
}

// Cell, hidden size and the attribute checks both ops share; r is operand `ri`.
Status common(const ShapeContext &c, size_t ri, Cell &cell, int64_t &h) {
  cell = cellOf(c.attrs.getString("cell", ""));
  SD_CHECK_ARG(cell != Cell::Unknown, "Recurrence cell must be RNN, GRU or LSTM");
  size_t n = size_t(activationCount(cell));
  std::string acts = c.attrs.getString("activations", "");
  SD_CHECK_ARG(size_t(std::count(acts.begin(), acts.end(), ',')) + 1 == n && !acts.empty(), "Recurrence ",
               c.attrs.getString("cell", ""), " takes ", n, " activations, got '", acts, "'");
  SD_CHECK_ARG(c.attrs.getFloats("activation_alpha").size() == n && c.attrs.getFloats("activation_beta").size() == n,
               "Recurrence needs one activation alpha and beta per activation");
  const TensorInfo &r = c.inputs[ri];
  SD_CHECK_ARG(!r.rankKnown || r.rank() == 2, "Recurrence R must be 2-D, got ", formatDims(r.dims));
  h = r.rankKnown ? r.dims[1] : -1;
  SD_CHECK_ARG(!r.rankKnown || agrees(r.dims[0], h < 0 ? -1 : gates(cell) * h), "Recurrence R is ",
               formatDims(r.dims), ", expected ", gates(cell), "H x H");
  SD_CHECK_ARG(dtypeIsFloat(c.inputs[0].dtype), "Recurrence computes in floating point, got ",
               dtypeName(c.inputs[0].dtype));
  return Status::ok();
}

Status recurrenceShape(ShapeContext &c) {
  Cell cell;
  int64_t h;
  SD_RETURN_IF_ERROR(common(c, 1, cell, h));
  const TensorInfo &xw = c.inputs[0];
  SD_CHECK_ARG(!xw.rankKnown || xw.rank() == 3, "Recurrence xw must be [seq, batch, gates*hidden], got ",
               formatDims(xw.dims));
  int64_t s = xw.rankKnown ? xw.dims[0] : -1, b = xw.rankKnown ? xw.dims[1] : -1;
  SD_RETURN_IF_ERROR(checkDims(c, 0, "Recurrence xw", {s, b, h < 0 ? -1 : gates(cell) * h}));
  SD_RETURN_IF_ERROR(checkDims(c, 2, "Recurrence initial_h", {b, h}));
  SD_RETURN_IF_ERROR(checkDims(c, 3, "Recurrence initial_c", {b, h}));
  SD_RETURN_IF_ERROR(checkDims(c, 4, "Recurrence peepholes", {h < 0 ? -1 : 3 * h}));
  SD_RETURN_IF_ERROR(checkDims(c, 5, "Recurrence reset_bias", {h}));
  SD_RETURN_IF_ERROR(checkDims(c, 6, "Recurrence sequence_lens", {b}));
  SD_CHECK_ARG(cell == Cell::LSTM || (!c.hasInput(3) && !c.hasInput(4)), "only LSTM has a cell state and peepholes");
  SD_CHECK_ARG(!c.hasInput(6) || dtypeIsInteger(c.inputs[6].dtype), "Recurrence sequence_lens must be integers");
  DType t = xw.dtype;
  c.outputs = {TensorInfo{t, {s, b, h}}, TensorInfo{t, {b, h}}, TensorInfo{t, {b, h}},
               TensorInfo{t, {s, b, h < 0 ? -1 : savedWidth(cell, h)}}};
  return Status::ok();
}

Status recurrenceGradShape(ShapeContext &c) {
  Cell cell;
  int64_t h;
  SD_RETURN_IF_ERROR(common(c, 2, cell, h));
  const TensorInfo &dy = c.inputs[0];
  SD_CHECK_ARG(!dy.rankKnown || dy.rank() == 3, "RecurrenceGrad grad must be [seq, batch, hidden]");
  int64_t s = dy.rankKnown ? dy.dims[0] : -1, b = dy.rankKnown ? dy.dims[1] : -1;
  SD_RETURN_IF_ERROR(checkDims(c, 0, "RecurrenceGrad grad", {s, b, h}));
  SD_RETURN_IF_ERROR(checkDims(c, 3, "RecurrenceGrad grad_h", {b, h}));
  SD_RETURN_IF_ERROR(checkDims(c, 4, "RecurrenceGrad grad_c", {b, h}));
  SD_RETURN_IF_ERROR(checkDims(c, 1, "RecurrenceGrad saved", {s, b, h < 0 ? -1 : savedWidth(cell, h)}));
  SD_RETURN_IF_ERROR(checkDims(c, 5, "RecurrenceGrad peepholes", {h < 0 ? -1 : 3 * h}));
  SD_RETURN_IF_ERROR(checkDims(c, 6, "RecurrenceGrad sequence_lens", {b}));
  DType t = dy.dtype;
  int64_t gh = h < 0 ? -1 : gates(cell) * h;
  c.outputs = {TensorInfo{t, {s, b, gh}}, TensorInfo{t, {gh, h}}, TensorInfo{t, {b, h}}, TensorInfo{t, {b, h}},
               TensorInfo{t, {h < 0 ? -1 : 3 * h}}, TensorInfo{t, {h}}};
  return Status::ok();
}

} // namespace

void registerRecurrentShapes() {
  registerShapeRule("Recurrence", recurrenceShape);
  registerShapeRule("RecurrenceGrad", recurrenceGradShape);
}

} // namespace sd
