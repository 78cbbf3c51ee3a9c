// Shape rules for the quantization ops.
#include "shape_util.h"

namespace sd {

Status matmulDims(const TensorInfo &a, const TensorInfo &b, TensorInfo &out);
namespace {

bool isInt8(DType t) { return t == DType::U8 || t == DType::I8; }
// What QuantizeLinear writes and DequantizeLinear reads: 8- and 16-bit
// integers, and the float8 and 4-/2-bit storage types.
bool isQuantized(DType t) { return isInt8(t) || t == DType::I16 || t == DType::U16 || dtypeIsNarrow(t); }

// The scale (and zero point) of x: one value, one per slice along `axis`, or
// with block_size > 0 (opset 21) x's shape with that dim split into blocks.
Status checkQuantParam(const ShapeContext &c, size_t i, const char *what) {
  if (!c.hasInput(i)) return Status::ok();
  const TensorInfo &x = c.inputs[0], &p = c.inputs[i];
  int64_t block = c.attrs.getInt("block_size", 0), axis = c.attrs.getInt("axis", 1);
  if (block == 0) return Status::ok();
  SD_CHECK_ARG(block > 0, "block_size must be positive");
  SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  SD_CHECK_ARG(p.rank() == x.rank(), "blocked ", what, " must have the input's rank ", x.rank());
  for (int64_t d = 0; d < x.rank(); ++d) {
    int64_t want = x.dims[size_t(d)] < 0 ? kUnknownDim
                   : d == axis ? (x.dims[size_t(d)] + block - 1) / block : x.dims[size_t(d)];
    SD_CHECK_ARG(want < 0 || p.dims[size_t(d)] < 0 || p.dims[size_t(d)] == want, "blocked ", what, " ",
                 formatDims(p.dims), " does not fit input ", formatDims(x.dims), " with block_size ", block,
                 " along axis ", axis);
  }
  return Status::ok();
}

Status quantizeShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(checkQuantParam(c, 1, "scale"));
  SD_RETURN_IF_ERROR(checkQuantParam(c, 2, "zero point"));
  SD_CHECK_ARG(dtypeIsFloat(c.inputs[0].dtype) || c.inputs[0].dtype == DType::I32, "QuantizeLinear input must be float");
  // The zero point's type, else output_dtype (opset 21), else uint8.
  DType out = c.hasInput(2) ? c.inputs[2].dtype : DType(c.attrs.getInt("output_dtype", int64_t(DType::U8)));
  if (out == DType::Undefined) out = DType::U8;
  SD_CHECK_ARG(isQuantized(out), "QuantizeLinear supports 8- and 16-bit integer, float8 and 4-/2-bit integer outputs, not ",
               dtypeName(out));
  c.outputs = {sameAs(c.inputs[0], out)};
  return Status::ok();
}

Status dequantizeShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(checkQuantParam(c, 1, "scale"));
  SD_RETURN_IF_ERROR(checkQuantParam(c, 2, "zero point"));
  SD_CHECK_ARG(isQuantized(c.inputs[0].dtype) || c.inputs[0].dtype == DType::I32,
               "DequantizeLinear input must be an 8-, 16- or 32-bit integer, float8 or a 4-/2-bit integer");
  // The scale's type, unless output_dtype (opset 23) names another float.
  DType out = DType(c.attrs.getInt("output_dtype", 0));
  if (out == DType::Undefined) out = c.inputs[1].dtype;
  SD_CHECK_ARG(dtypeIsFloat(out), "DequantizeLinear output_dtype must be a float type, not ", dtypeName(out));
  c.outputs = {sameAs(c.inputs[0], out)};
  return Status::ok();
}

Status dynamicQuantizeShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs[0].dtype == DType::F32, "DynamicQuantizeLinear input must be f32");
  TensorInfo scalarF, scalarU;
  scalarF.dtype = DType::F32;
  scalarU.dtype = DType::U8;
  c.outputs = {sameAs(c.inputs[0], DType::U8), scalarF, scalarU};
  return Status::ok();
}

Status matmulIntegerShape(ShapeContext &c) {
  SD_CHECK_ARG(isInt8(c.inputs[0].dtype) && isInt8(c.inputs[1].dtype), "MatMulInteger needs 8-bit inputs");
  TensorInfo out;
  SD_RETURN_IF_ERROR(matmulDims(c.inputs[0], c.inputs[1], out));
  out.dtype = DType::I32;
  c.outputs = {out};
  return Status::ok();
}

Status qlinearMatmulShape(ShapeContext &c) {
  SD_CHECK_ARG(isInt8(c.inputs[0].dtype) && isInt8(c.inputs[3].dtype), "QLinearMatMul needs 8-bit inputs");
  TensorInfo out;
  SD_RETURN_IF_ERROR(matmulDims(c.inputs[0], c.inputs[3], out));
  out.dtype = c.inputs[7].dtype;
  c.outputs = {out};
  return Status::ok();
}

// ConvInteger / QLinearConv: reuse Conv's rule on float stand-ins.
Status convLike(ShapeContext &c, size_t x, size_t w, size_t bias, DType result) {
  AttrMap attrs = c.attrs;
  TensorInfo xf = sameAs(c.inputs[x], DType::F32), wf = sameAs(c.inputs[w], DType::F32);
  ShapeContext inner{c.attrs, {xf, wf}, {nullptr, nullptr}, {}, 1};
  if (bias < c.inputs.size() && c.hasInput(bias)) inner.inputs.push_back(sameAs(c.inputs[bias], DType::F32));
  SD_RETURN_IF_ERROR(inferShapes("Conv", inner));
  c.outputs = {sameAs(inner.outputs[0], result)};
  return Status::ok();
}
Status convIntegerShape(ShapeContext &c) { return convLike(c, 0, 1, 99, DType::I32); }
Status qlinearConvShape(ShapeContext &c) { return convLike(c, 0, 3, 8, c.inputs[7].dtype); }

} // namespace

// MatMulNBits(a [..., K], b u8, scales, zero_points?, bias?) -> [..., N]: each
// operand holds what K, N, bits and block_size say (b and scales as
// onnxruntime shapes them or flattened; the count is what matters).
static Status matmulNBitsShape(ShapeContext &c) {
  const int64_t K = c.attrs.getInt("K", 0), N = c.attrs.getInt("N", 0), bits = c.attrs.getInt("bits", 4),
                block = c.attrs.getInt("block_size", 0);
  SD_CHECK_ARG(K > 0 && N > 0, "MatMulNBits: K and N must be positive");
  SD_CHECK_ARG(bits == 2 || bits == 4 || bits == 8, "MatMulNBits: bits must be 2, 4 or 8, not ", bits);
  SD_CHECK_ARG(block >= 16 && (block & (block - 1)) == 0, "MatMulNBits: block_size must be a power of two >= 16");
  const TensorInfo &a = c.inputs[0];
  SD_CHECK_ARG(a.dtype == DType::F32, "MatMulNBits: A must be f32, not ", dtypeName(a.dtype));
  SD_CHECK_ARG(!a.rankKnown || a.rank() >= 1, "MatMulNBits: A must have at least one axis");
  SD_CHECK_ARG(!a.rankKnown || a.dims.back() < 0 || a.dims.back() == K, "MatMulNBits: A ", formatDims(a.dims),
               " does not end in K = ", K);
  const int64_t blocks = (K + block - 1) / block;
  auto holds = [&](size_t i, DType t, int64_t count, const char *what) -> Status {
    const TensorInfo &v = c.inputs[i];
    SD_CHECK_ARG(v.dtype == t, "MatMulNBits: ", what, " must be ", dtypeName(t), ", not ", dtypeName(v.dtype));
    SD_CHECK_ARG(!v.isStatic() || v.numElements() == count, "MatMulNBits: ", what, " ", formatDims(v.dims),
                 " does not hold the ", count, " values N = ", N, ", K = ", K, ", bits ", bits, " and block_size ",
                 block, " need");
    return Status::ok();
  };
  SD_RETURN_IF_ERROR(holds(1, DType::U8, N * blocks * (block * bits / 8), "B"));
  SD_RETURN_IF_ERROR(holds(2, a.dtype, N * blocks, "scales"));
  if (c.hasInput(3)) {
    const bool packed = c.inputs[3].dtype == DType::U8;
    SD_RETURN_IF_ERROR(holds(3, packed ? DType::U8 : a.dtype, packed ? N * ((blocks * bits + 7) / 8) : N * blocks,
                             "zero_points"));
  }
  if (c.hasInput(4)) SD_RETURN_IF_ERROR(holds(4, a.dtype, N, "bias"));
  TensorInfo y = a;
  if (y.rankKnown) y.dims.back() = N;
  c.outputs = {y};
  return Status::ok();
}

void registerQuantizedShapes() {
  registerShapeRule("MatMulNBits", matmulNBitsShape);
  registerShapeRule("QuantizeLinear", quantizeShape);
  registerShapeRule("DequantizeLinear", dequantizeShape);
  registerShapeRule("DynamicQuantizeLinear", dynamicQuantizeShape);
  registerShapeRule("MatMulInteger", matmulIntegerShape);
  registerShapeRule("QLinearMatMul", qlinearMatmulShape);
  registerShapeRule("ConvInteger", convIntegerShape);
  registerShapeRule("QLinearConv", qlinearConvShape);
}

} // namespace sd
