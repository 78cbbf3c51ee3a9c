// Shape rules for Resize (scales or sizes, optional axes) and Einsum.
#include "sd/ops/einsum.h"
#include "shape_util.h"
#include <cmath>

namespace sd {
namespace {

// Resize(X, roi, scales, sizes). Output dims need scales or sizes as constants.
Status resizeShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  std::string mode = c.attrs.getString("mode", "nearest");
  SD_CHECK_ARG(!c.attrs.getInt("antialias", 0) || mode != "nearest", "Resize antialias needs mode linear or cubic");
  SD_CHECK_ARG(mode == "nearest" || mode == "linear" || mode == "cubic", "Resize mode '", mode, "' is not supported");
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "coordinate_transformation_mode",
                                 {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                  "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"}));
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "nearest_mode", {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}));
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "keep_aspect_ratio_policy", {"stretch", "not_larger", "not_smaller"}));
  std::vector<int64_t> axes = c.attrs.getInts("axes");
  int64_t r = x.rank();
  if (axes.empty())
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  for (int64_t &a : axes) SD_RETURN_IF_ERROR(normalizeAxis(a, r, "Resize axis"));
  TensorInfo out = x;
  std::vector<int64_t> sizes;
  std::vector<double> scales;
  bool haveSizes = c.hasInput(3) && c.inputs[3].numElements() != 0;
  bool haveScales = c.hasInput(2) && c.inputs[2].numElements() != 0;
  SD_CHECK_ARG(haveSizes != haveScales, "Resize needs exactly one of scales and sizes");
  if (haveSizes && !c.constInts(3, sizes)) {
    for (int64_t a : axes) out.dims[size_t(a)] = kUnknownDim;
    c.outputs = {out};
    return Status::ok();
  }
  if (haveScales && !(c.constInput(2) && readDoubles(*c.constInput(2), scales))) {
    for (int64_t a : axes) out.dims[size_t(a)] = kUnknownDim;
    c.outputs = {out};
    return Status::ok();
  }
  size_t n = haveSizes ? sizes.size() : scales.size();
  SD_CHECK_ARG(n == axes.size(), "Resize ", haveSizes ? "sizes" : "scales", " has ", n, " entries for ", axes.size(), " axes");
  std::string policy = c.attrs.getString("keep_aspect_ratio_policy", "stretch");
  if (haveSizes && policy != "stretch") {
    double s = policy == "not_larger" ? 1e300 : 0;
    for (size_t i = 0; i < n; ++i) {
      double si = double(sizes[i]) / double(x.dims[size_t(axes[i])]);
      s = policy == "not_larger" ? std::min(s, si) : std::max(s, si);
    }
    for (size_t i = 0; i < n; ++i) sizes[i] = int64_t(std::round(s * double(x.dims[size_t(axes[i])])));
  }
  for (size_t i = 0; i < n; ++i) {
    int64_t d = x.dims[size_t(axes[i])];
    if (haveSizes) {
      SD_CHECK_ARG(sizes[i] >= 0, "Resize size ", sizes[i], " is negative");
      out.dims[size_t(axes[i])] = sizes[i];
    } else {
      SD_CHECK_ARG(scales[i] > 0, "Resize scale ", scales[i], " must be positive");
      out.dims[size_t(axes[i])] = d < 0 ? kUnknownDim : int64_t(std::floor(double(d) * scales[i]));
    }
  }
  c.outputs = {out};
  return Status::ok();
}

// ResizeGrad(dy, roi?, scales?) {input_shape} -> d(x): x's shape, dy's type.
Status resizeGradShape(ShapeContext &c) {
  TensorInfo out;
  out.dtype = c.inputs[0].dtype;
  for (int64_t d : c.attrs.getInts("input_shape")) {
    SD_CHECK_ARG(d >= 0, "ResizeGrad input_shape must be static");
    out.dims.push_back(d);
  }
  SD_CHECK_ARG(!c.inputs[0].rankKnown || c.inputs[0].dims.size() == out.dims.size(),
               "ResizeGrad: the gradient's rank differs from input_shape's");
  c.outputs = {out};
  return Status::ok();
}

Status einsumShape(ShapeContext &c) {
  EinsumSpec spec;
  std::vector<Dims> dims;
  for (auto &t : c.inputs) {
    SD_CHECK_ARG(t.rankKnown, "Einsum needs ranked inputs");
    SD_CHECK_ARG(t.dtype == c.inputs[0].dtype, "Einsum operands differ in type");
    dims.push_back(t.dims);
  }
  SD_RETURN_IF_ERROR(parseEinsum(c.attrs.getString("equation", ""), dims, spec));
  TensorInfo out;
  out.dtype = c.inputs[0].dtype;
  for (int l : spec.outputLabels) out.dims.push_back(spec.labelSize[size_t(l)]);
  c.outputs = {out};
  return Status::ok();
}

} // namespace

void registerResizeEinsumShapes() {
  registerShapeRule("Resize", resizeShape);
  registerShapeRule("ResizeGrad", resizeGradShape);
  registerShapeRule("Einsum", einsumShape);
}

} // namespace sd
