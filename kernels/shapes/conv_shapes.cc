// Shape rules for Conv, ConvTranspose, MaxPool, AveragePool, LpPool and the
// global pools.
#include "sd/ops/window_geometry.h"
#include "shape_util.h"

namespace sd {
namespace {

Dims spatialOf(const TensorInfo &t) { return Dims(t.dims.begin() + 2, t.dims.end()); }

Status convShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &w = c.inputs[1];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype) && w.dtype == x.dtype, "Conv needs float input and weight of one type");
  SD_CHECK_ARG(x.rank() >= 3 && w.rank() == x.rank(), "Conv input must be [N, C, ...] and weight [M, C/group, ...]");
  int64_t group = c.attrs.getInt("group", 1);
  SD_CHECK_ARG(group >= 1, "group must be >= 1");
  SD_CHECK_ARG(x.dims[1] < 0 || w.dims[1] < 0 || x.dims[1] == w.dims[1] * group, "Conv channels ", x.dims[1],
               " != weight channels ", w.dims[1], " x group ", group);
  SD_CHECK_ARG(w.dims[0] < 0 || w.dims[0] % group == 0, "Conv output channels not divisible by group");
  Dims kernel = c.attrs.getInts("kernel_shape");
  if (kernel.empty()) kernel = spatialOf(w);
  if (c.hasInput(2)) SD_CHECK_ARG(c.inputs[2].rank() == 1 && c.inputs[2].dims[0] == w.dims[0], "Conv bias must be [M]");
  TensorInfo out;
  out.dtype = x.dtype;
  out.dims = {x.dims[0], w.dims[0]};
  if (!x.isStatic()) {
    out.dims.resize(size_t(x.rank()), kUnknownDim);
  } else {
    WindowGeometry g;
    SD_RETURN_IF_ERROR(resolveWindows(c.attrs, spatialOf(x), kernel, false, g));
    out.dims.insert(out.dims.end(), g.out.begin(), g.out.end());
  }
  c.outputs = {out};
  return Status::ok();
}

// Conv with a residual operand of the output's shape and an activation.
Status fusedConvShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(convShape(c));
  if (c.hasInput(3))
    SD_CHECK_ARG(c.inputs[3].dtype == c.outputs[0].dtype && c.inputs[3].dims == c.outputs[0].dims,
                 "FusedConv residual must have the output's type and shape");
  static const char *kActivations[] = {"", "Relu", "Clip", "HardSwish", "HardSigmoid", "LeakyRelu"};
  std::string act = c.attrs.getString("activation", "");
  bool known = false;
  for (const char *a : kActivations) known = known || act == a;
  SD_CHECK_ARG(known, "FusedConv activation '", act, "' is not one of Relu, Clip, HardSwish, HardSigmoid, LeakyRelu");
  return Status::ok();
}

Status convTransposeShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &w = c.inputs[1];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype) && w.dtype == x.dtype, "ConvTranspose needs float input and weight");
  SD_CHECK_ARG(x.rank() >= 3 && w.rank() == x.rank(), "ConvTranspose input must be [N, C, ...], weight [C, M/group, ...]");
  int64_t group = c.attrs.getInt("group", 1);
  SD_CHECK_ARG(group >= 1 && (x.dims[1] < 0 || x.dims[1] == w.dims[0]), "ConvTranspose channels mismatch");
  Dims kernel = c.attrs.getInts("kernel_shape");
  if (kernel.empty()) kernel = spatialOf(w);
  TensorInfo out;
  out.dtype = x.dtype;
  out.dims = {x.dims[0], w.dims[1] * group};
  if (c.hasInput(2)) SD_CHECK_ARG(c.inputs[2].rank() == 1 && c.inputs[2].dims[0] == out.dims[1], "ConvTranspose bias must be [M]");
  if (!x.isStatic()) {
    out.dims.resize(size_t(x.rank()), kUnknownDim);
  } else {
    WindowGeometry g;
    SD_RETURN_IF_ERROR(resolveTransposedWindows(c.attrs, spatialOf(x), kernel, g));
    out.dims.insert(out.dims.end(), g.out.begin(), g.out.end());
  }
  c.outputs = {out};
  return Status::ok();
}

Status poolShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(x.rank() >= 3, "pool input must be [N, C, ...]");
  Dims kernel = c.attrs.getInts("kernel_shape");
  SD_CHECK_ARG(int64_t(kernel.size()) == x.rank() - 2, "kernel_shape must have ", x.rank() - 2, " entries");
  TensorInfo out = x;
  if (x.isStatic()) {
    WindowGeometry g;
    SD_RETURN_IF_ERROR(resolveWindows(c.attrs, spatialOf(x), kernel, true, g));
    for (size_t i = 0; i < g.out.size(); ++i) out.dims[i + 2] = g.out[i];
  } else {
    for (size_t i = 2; i < out.dims.size(); ++i) out.dims[i] = kUnknownDim;
  }
  c.outputs = {out, sameAs(out, DType::I64)};
  return Status::ok();
}

Status globalPoolShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(x.rank() >= 3, "global pool input must be [N, C, ...]");
  TensorInfo out = x;
  for (size_t i = 2; i < out.dims.size(); ++i) out.dims[i] = 1;
  c.outputs = {out};
  return Status::ok();
}

} // namespace

void registerConvShapes() {
  registerShapeRule("Conv", convShape);
  registerShapeRule("FusedConv", fusedConvShape);
  registerShapeRule("ConvTranspose", convTransposeShape);
  registerShapeRule("MaxPool", poolShape);
  registerShapeRule("AveragePool", poolShape);
  registerShapeRule("LpPool", poolShape);
  registerShapeRule("GlobalAveragePool", globalPoolShape);
  registerShapeRule("GlobalMaxPool", globalPoolShape);
  registerShapeRule("GlobalLpPool", globalPoolShape);
}

} // namespace sd
