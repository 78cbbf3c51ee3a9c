// Shape rule of Rotary (sd-fuse-rotary's rotary position embedding):
// x [B, ..., S, D] (S at seq_axis, default rank - 2); cos and sin [Bc, S, W] (Bc 1 or B), or tables [P, W]
// indexed by positions i64 [B, S]; W is D or D/2. The result is x's shape
// and type; cos and sin have x's type, or f32 with a bf16/f16 x. With
// rotated_heads R, x is [B, S, P, D] (seq_axis 1) and only heads < R rotate.
#include "shape_util.h"

namespace sd {

static Status rotaryShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &cosT = c.inputs[1], &sinT = c.inputs[2];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype), "Rotary expects a float input");
  // f32 tables with a half input: sd-half-elementwise's form (the math in f32).
  const bool tablesOk = cosT.dtype == sinT.dtype && (cosT.dtype == x.dtype ||
                                                      (cosT.dtype == DType::F32 && dtypeIsHalf(x.dtype)));
  SD_CHECK_ARG(tablesOk, "Rotary's cos and sin must have the input's type (", dtypeName(x.dtype),
               dtypeIsHalf(x.dtype) ? " or f32" : "", ")");
  SD_CHECK_ARG(x.rank() >= 3, "Rotary takes an input [B, ..., S, D], got ", formatDims(x.dims));
  SD_CHECK_ARG(cosT.dims == sinT.dims, "Rotary's cos and sin differ in shape: ", formatDims(cosT.dims), " and ",
               formatDims(sinT.dims));
  const int64_t seqAxis = c.attrs.getInt("seq_axis", int64_t(x.rank()) - 2);
  SD_CHECK_ARG(seqAxis >= 1 && seqAxis <= int64_t(x.rank()) - 2, "Rotary: seq_axis ", seqAxis,
               " is not an axis of ", formatDims(x.dims), " between the batch and the features");
  int64_t b = x.dims[0], s = x.dims[size_t(seqAxis)], d = x.dims[size_t(x.rank() - 1)];
  SD_CHECK_ARG(d < 0 || d % 2 == 0, "Rotary rotates pairs: the last dim must be even, got ", d);
  int64_t w = cosT.dims.empty() ? -1 : cosT.dims.back();
  SD_CHECK_ARG(w < 0 || d < 0 || w == d || 2 * w == d, "Rotary's cos and sin must be ", d, " or ", d / 2,
               " wide, got ", formatDims(cosT.dims));
  if (c.hasInput(3)) {
    const TensorInfo &p = c.inputs[3];
    SD_CHECK_ARG(p.dtype == DType::I64 && p.rank() == 2 && (p.dims[0] < 0 || b < 0 || p.dims[0] == b) &&
                     (p.dims[1] < 0 || s < 0 || p.dims[1] == s),
                 "Rotary's positions must be int64 [", b, ", ", s, "], got ", formatDims(p.dims));
    SD_CHECK_ARG(cosT.rank() == 2, "Rotary with positions takes cos and sin tables [P, W], got ",
                 formatDims(cosT.dims));
  } else {
    SD_CHECK_ARG(cosT.rank() == 3 && (cosT.dims[0] == 1 || cosT.dims[0] == b || cosT.dims[0] < 0 || b < 0) &&
                     (cosT.dims[1] < 0 || s < 0 || cosT.dims[1] == s),
                 "Rotary takes cos and sin [1 or ", b, ", ", s, ", W], got ", formatDims(cosT.dims));
  }
  if (const int64_t rotated = c.attrs.getInt("rotated_heads", 0)) {
    SD_CHECK_ARG(x.rank() == 4 && seqAxis == 1 && rotated > 0 && (x.dims[2] < 0 || rotated <= x.dims[2]),
                 "Rotary: rotated_heads ", rotated, " needs token-major heads [B, S, P >= ", rotated,
                 ", D] (seq_axis 1), got ", formatDims(x.dims));
  }
  DType yType;
  SD_RETURN_IF_ERROR(roundedResultType(c.attrs, x.dtype, "Rotary", yType));
  c.outputs = {TensorInfo{yType, x.dims}};
  return Status::ok();
}

void registerRotaryShapes() { registerShapeRule("Rotary", rotaryShape); }

} // namespace sd
