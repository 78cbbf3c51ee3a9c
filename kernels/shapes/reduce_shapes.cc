// Shape rules for reductions (axes as operand, as in opset 18), ArgMax/ArgMin,
// Softmax-style ops and the normalizations.
#include "shape_util.h"
#include <algorithm>

namespace sd {

// Resolves the reduction axes; `all` is set when every axis is reduced.
Status reductionAxes(const ShapeContext &c, int64_t rank, std::vector<bool> &reduced, bool &known) {
  reduced.assign(size_t(std::max<int64_t>(rank, 0)), false);
  known = true;
  std::vector<int64_t> axes;
  if (c.hasInput(1)) {
    if (!c.constInts(1, axes)) {
      known = false;
      return Status::ok();
    }
  } else {
    axes = c.attrs.getInts("axes");
  }
  if (axes.empty()) {
    if (c.attrs.getInt("noop_with_empty_axes", 0)) return Status::ok();
    reduced.assign(reduced.size(), true);
    return Status::ok();
  }
  for (int64_t a : axes) {
    SD_RETURN_IF_ERROR(normalizeAxis(a, rank, "reduction axis"));
    reduced[size_t(a)] = true;
  }
  return Status::ok();
}

static Status reduceShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  bool keep = c.attrs.getInt("keepdims", 1) != 0;
  if (!x.rankKnown) {
    c.outputs = {unknownRank(x.dtype)};
    return Status::ok();
  }
  std::vector<bool> reduced;
  bool known;
  SD_RETURN_IF_ERROR(reductionAxes(c, x.rank(), reduced, known));
  TensorInfo out;
  out.dtype = x.dtype;
  if (!known) {
    // Without keepdims the rank still follows from how many axes there are
    // (ONNX axes are distinct); only which dims remain is unknown.
    const TensorInfo &axes = c.inputs[1];
    int64_t count = axes.rankKnown && axes.rank() == 1 ? axes.dims[0] : kUnknownDim;
    if (count == 0 && !c.attrs.getInt("noop_with_empty_axes", 0)) count = x.rank();
    if (keep) out.dims.assign(x.dims.size(), kUnknownDim);
    else if (count >= 0 && count <= x.rank()) out.dims.assign(size_t(x.rank() - count), kUnknownDim);
    else out.rankKnown = false;
    c.outputs = {out};
    return Status::ok();
  }
  for (size_t i = 0; i < x.dims.size(); ++i) {
    if (!reduced[i]) out.dims.push_back(x.dims[i]);
    else if (keep) out.dims.push_back(1);
  }
  c.outputs = {out};
  return Status::ok();
}

static Status argShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  TensorInfo out = sameAs(x, DType::I64);
  if (c.attrs.getInt("keepdims", 1)) out.dims[size_t(axis)] = 1;
  else out.dims.erase(out.dims.begin() + axis);
  c.outputs = {out};
  return Status::ok();
}

static Status softmaxShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype), "expects a float tensor");
  int64_t axis = c.attrs.getInt("axis", -1);
  if (x.rankKnown) SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  c.outputs = {x};
  return Status::ok();
}

static Status layerNormShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype), "LayerNormalization expects a float tensor");
  int64_t axis = c.attrs.getInt("axis", -1);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  TensorInfo stats = x;
  int64_t stash = c.attrs.getInt("stash_type", 1);
  stats.dtype = stash == 1 ? DType::F32 : x.dtype;
  for (size_t i = size_t(axis); i < stats.dims.size(); ++i) stats.dims[i] = 1;
  DType yType;
  SD_RETURN_IF_ERROR(roundedResultType(c.attrs, x.dtype, "LayerNormalization", yType));
  c.outputs = {TensorInfo{yType, x.dims, x.rankKnown}, stats, stats};
  return Status::ok();
}

static Status rmsNormShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype), "RMSNormalization expects a float tensor");
  int64_t axis = c.attrs.getInt("axis", -1);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  DType yType;
  SD_RETURN_IF_ERROR(roundedResultType(c.attrs, x.dtype, "RMSNormalization", yType));
  c.outputs = {TensorInfo{yType, x.dims, x.rankKnown}};
  return Status::ok();
}

static Status batchNormShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(x.rank() >= 2, "BatchNormalization input must have rank >= 2");
  SD_CHECK_ARG(!c.attrs.getInt("training_mode", 0),
               "BatchNormalization training_mode is not supported at inference");
  c.outputs = {x};
  return Status::ok();
}

static Status sameFloat(ShapeContext &c) {
  SD_CHECK_ARG(dtypeIsFloat(c.inputs[0].dtype), "expects a float tensor");
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

// LRN: [N, C, D1..Dk] unchanged; size is the channel window.
static Status lrnShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype), "LRN takes a float tensor");
  SD_CHECK_ARG(x.rank() >= 3, "LRN takes [N, C, D1, ...], got rank ", x.rank());
  SD_CHECK_ARG(c.attrs.getInt("size", 0) >= 1, "LRN needs a positive size");
  c.outputs = {x};
  return Status::ok();
}

void registerReduceShapes() {
  registerShapeRule("LRN", lrnShape);
  for (const char *op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                         "ReduceSumSquare"})
    registerShapeRule(op, reduceShape);
  registerShapeRule("ArgMax", argShape);
  registerShapeRule("ArgMin", argShape);
  for (const char *op : {"Softmax", "LogSoftmax", "Hardmax"})
    registerShapeRule(op, softmaxShape);
  registerShapeRule("LayerNormalization", layerNormShape);
  registerShapeRule("RMSNormalization", rmsNormShape);
  registerShapeRule("BatchNormalization", batchNormShape);
  for (const char *op : {"InstanceNormalization", "LpNormalization", "MeanVarianceNormalization"})
    registerShapeRule(op, sameFloat);
}

} // namespace sd
