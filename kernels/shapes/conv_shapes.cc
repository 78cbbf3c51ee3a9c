// Shape rules for Conv, ConvTranspose, DeformConv, Col2Im, MaxPool,
// AveragePool, LpPool, MaxUnpool and the global pools.
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

// MaxUnpool: [N, C, (in - 1) * stride - pads + kernel] or the output_shape operand.
Status maxUnpoolShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &idx = c.inputs[1];
  Dims kernel = c.attrs.getInts("kernel_shape"), strides = c.attrs.getInts("strides"), pads = c.attrs.getInts("pads");
  size_t k = kernel.size();
  SD_CHECK_ARG(k >= 1 && x.rank() == int64_t(k) + 2, "MaxUnpool needs kernel_shape for each spatial dim of X");
  SD_CHECK_ARG((strides.empty() || strides.size() == k) && (pads.empty() || pads.size() == 2 * k),
               "MaxUnpool strides/pads do not match kernel_shape");
  SD_CHECK_ARG(dtypeIsInteger(idx.dtype) && idx.rank() == x.rank(), "MaxUnpool indices must be integers shaped like X");
  TensorInfo out{x.dtype, {x.dims[0], x.dims[1]}};
  for (size_t d = 0; d < k; ++d) {
    int64_t in = x.dims[d + 2];
    out.dims.push_back(in < 0 ? kUnknownDim
                              : (in - 1) * (strides.empty() ? 1 : strides[d]) -
                                    (pads.empty() ? 0 : pads[d] + pads[d + k]) + kernel[d]);
    SD_CHECK_ARG(out.dims.back() >= kUnknownDim && out.dims.back() != 0, "MaxUnpool gives an empty dim");
  }
  if (c.hasInput(2)) {
    std::vector<int64_t> shape;
    if (!c.constInts(2, shape)) {
      out.dims.assign(out.dims.size(), kUnknownDim);
    } else {
      SD_CHECK_ARG(shape.size() == out.dims.size(), "MaxUnpool output_shape must have rank ", out.dims.size());
      for (size_t d = 0; d < shape.size(); ++d)
        SD_CHECK_ARG(out.dims[d] < 0 || shape[d] >= out.dims[d], "MaxUnpool output_shape ", formatDims(shape),
                     " is smaller than the unpooled shape ", formatDims(out.dims));
      out.dims = Dims(shape.begin(), shape.end());
    }
  }
  c.outputs = {out};
  return Status::ok();
}

// Col2Im: input [N, C * prod(block), L] with image_shape and block_shape
// constant operands gives [N, C, image...]; L must be the number of blocks.
Status col2ImShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype) && x.rank() == 3, "Col2Im takes a float [N, C * prod(block_shape), L]");
  std::vector<int64_t> image, block;
  if (!c.constInts(1, image) || !c.constInts(2, block)) {
    c.outputs = {unknownRank(x.dtype)};
    return Status::ok();
  }
  size_t k = image.size();
  SD_CHECK_ARG(k >= 1 && block.size() == k, "Col2Im image_shape and block_shape must have one entry per spatial dim");
  Dims dil = c.attrs.getInts("dilations"), pads = c.attrs.getInts("pads"), strides = c.attrs.getInts("strides");
  if (dil.empty()) dil.assign(k, 1);
  if (strides.empty()) strides.assign(k, 1);
  if (pads.empty()) pads.assign(2 * k, 0);
  SD_CHECK_ARG(dil.size() == k && strides.size() == k && pads.size() == 2 * k,
               "Col2Im dilations/strides/pads do not match image_shape");
  int64_t taps = 1, blocks = 1;
  for (size_t d = 0; d < k; ++d) {
    SD_CHECK_ARG(image[d] > 0 && block[d] > 0 && dil[d] > 0 && strides[d] > 0, "Col2Im sizes must be positive");
    int64_t n = (image[d] + pads[d] + pads[d + k] - dil[d] * (block[d] - 1) - 1) / strides[d] + 1;
    SD_CHECK_ARG(n >= 1, "Col2Im block_shape does not fit image_shape");
    taps *= block[d], blocks *= n;
  }
  SD_CHECK_ARG(x.dims[1] < 0 || x.dims[1] % taps == 0, "Col2Im input dim 1 (", x.dims[1],
               ") does not divide by prod(block_shape) = ", taps);
  SD_CHECK_ARG(x.dims[2] < 0 || x.dims[2] == blocks, "Col2Im input has ", x.dims[2], " blocks, the geometry gives ",
               blocks);
  TensorInfo out{x.dtype, {x.dims[0], x.dims[1] < 0 ? kUnknownDim : x.dims[1] / taps}};
  out.dims.insert(out.dims.end(), image.begin(), image.end());
  c.outputs = {out};
  return Status::ok();
}

// DeformConv (2-D): X [N, C, H, W], W [M, C/group, kh, kw], offset
// [N, offset_group * kh * kw * 2, oh, ow] (oh, ow: Conv's output size),
// optional B [M] and mask [N, offset_group * kh * kw, oh, ow] -> [N, M, oh, ow].
Status deformConvShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &w = c.inputs[1], &offset = c.inputs[2];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype) && w.dtype == x.dtype && offset.dtype == x.dtype,
               "DeformConv needs X, W and offset of one float type");
  SD_CHECK_ARG(x.rank() == 4 && w.rank() == 4 && offset.rank() == 4, "DeformConv takes 2-D images: X, W and offset "
               "of rank 4");
  SD_CHECK_ARG(x.isStatic() && w.isStatic() && offset.isStatic(), "DeformConv needs static shapes");
  int64_t group = c.attrs.getInt("group", 1), og = c.attrs.getInt("offset_group", 1);
  SD_CHECK_ARG(group >= 1 && og >= 1 && x.dims[1] == w.dims[1] * group && w.dims[0] % group == 0 &&
               x.dims[1] % og == 0, "DeformConv channels do not fit group ", group, " and offset_group ", og);
  Dims kernel = c.attrs.getInts("kernel_shape");
  if (kernel.empty()) kernel = spatialOf(w);
  SD_CHECK_ARG(kernel == spatialOf(w), "DeformConv kernel_shape differs from the weight's");
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, spatialOf(x), kernel, false, g));
  int64_t taps = kernel[0] * kernel[1];
  Dims want = {x.dims[0], og * taps * 2, g.out[0], g.out[1]};
  SD_CHECK_ARG(offset.dims == want, "DeformConv offset must be ", formatDims(want), ", got ", formatDims(offset.dims));
  if (c.hasInput(3)) SD_CHECK_ARG(c.inputs[3].dims == Dims{w.dims[0]}, "DeformConv B must be [M]");
  if (c.hasInput(4)) {
    Dims m = {x.dims[0], og * taps, g.out[0], g.out[1]};
    SD_CHECK_ARG(c.inputs[4].dims == m, "DeformConv mask must be ", formatDims(m));
  }
  c.outputs = {TensorInfo{x.dtype, {x.dims[0], w.dims[0], g.out[0], g.out[1]}}};
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
  registerShapeRule("MaxUnpool", maxUnpoolShape);
  registerShapeRule("Col2Im", col2ImShape);
  registerShapeRule("DeformConv", deformConvShape);
  registerShapeRule("MaxPool", poolShape);
  registerShapeRule("AveragePool", poolShape);
  registerShapeRule("LpPool", poolShape);
  registerShapeRule("GlobalAveragePool", globalPoolShape);
  registerShapeRule("GlobalMaxPool", globalPoolShape);
  registerShapeRule("GlobalLpPool", globalPoolShape);
}

} // namespace sd
