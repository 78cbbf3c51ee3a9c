// CPU kernels for quantization: Quantize/Dequantize/DynamicQuantizeLinear,
// MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv. The integer products
// run exactly in double through the MatMul and Conv kernels (|sums| < 2^53),
// then requantize with round-half-to-even and saturation.
#include "cpu_util.h"
#include <algorithm>
#include <cmath>
#include <limits>

namespace sd::cpu {
namespace {

Status runOp(const char *op, const AttrMap &attrs, std::vector<TensorView> ins, TensorView out) {
  KernelContext c{attrs, std::move(ins), {out}, nullptr};
  return runKernel(*cpuKernels().find(op), c);
}

template <typename T> T saturate(double v) {
  v = std::nearbyint(v);
  double lo = double(std::numeric_limits<T>::lowest()), hi = double(std::numeric_limits<T>::max());
  return T(v < lo ? lo : (v > hi ? hi : v));
}

// 4- and 2-bit integers saturate to their own range (one byte each in memory).
int8_t saturateNarrow(double v, DType t) {
  bool isSigned = t == DType::I4 || t == DType::I2;
  int bits = (t == DType::I4 || t == DType::U4) ? 4 : 2;
  double lo = isSigned ? -double(1 << (bits - 1)) : 0, hi = isSigned ? double((1 << (bits - 1)) - 1) : double((1 << bits) - 1);
  return int8_t(std::clamp(std::nearbyint(v), lo, hi));
}

Status storeQuantized(const std::vector<double> &v, const TensorView &out) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtypeIsNarrow(out.dtype)) out.as<int8_t>()[i] = saturateNarrow(v[i], out.dtype);
    else if (out.dtype == DType::U8) out.as<uint8_t>()[i] = saturate<uint8_t>(v[i]);
    else if (out.dtype == DType::I16) out.as<int16_t>()[i] = saturate<int16_t>(v[i]);
    else if (out.dtype == DType::U16) out.as<uint16_t>()[i] = saturate<uint16_t>(v[i]);
    else if (out.dtype == DType::I8) out.as<int8_t>()[i] = saturate<int8_t>(v[i]);
    else if (out.dtype == DType::I32) out.as<int32_t>()[i] = saturate<int32_t>(v[i]);
    else return sdError("unsupported quantized type ", dtypeName(out.dtype));
  }
  return Status::ok();
}

// Per-element values of a per-tensor, per-axis or blocked (block > 0: the
// parameter has t's shape with `axis` in blocks) parameter (scale, zero point).
std::vector<double> broadcastAlong(const TensorView &t, const TensorView &s, int64_t axis, int64_t block = 0) {
  std::vector<double> sv, out(size_t(t.numElements()));
  readDoubles(s, sv);
  if (sv.size() == 1 && block == 0) return std::vector<double>(out.size(), sv[0]);
  if (axis < 0) axis += t.rank();
  AxisExtent e = extentAround(t.dims, axis);
  int64_t blocks = block > 0 ? (e.len + block - 1) / block : 0;
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t at = (int64_t(i) / e.inner) % e.len;
    if (block == 0) out[i] = sv[size_t(at)];
    else out[i] = sv[size_t(((int64_t(i) / (e.inner * e.len)) * blocks + at / block) * e.inner + int64_t(i) % e.inner)];
  }
  return out;
}

// Values of `t` minus a zero point broadcast along `axis` (per-tensor when the
// zero point has one element), as doubles.
std::vector<double> centered(const TensorView &t, const TensorView *zp, int64_t axis, int64_t block = 0) {
  std::vector<double> v;
  readDoubles(t, v);
  if (!zp || !zp->data) return v;
  std::vector<double> z = broadcastAlong(t, *zp, axis, block);
  for (size_t i = 0; i < v.size(); ++i) v[i] -= z[i];
  return v;
}

Status QuantizeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", 1), block = c.attrs.getInt("block_size", 0);
  std::vector<double> v, scale = broadcastAlong(x, c.inputs[1], axis, block);
  readDoubles(x, v);
  std::vector<double> zp(v.size(), 0.0);
  if (c.hasInput(2) && c.inputs[2].data) zp = broadcastAlong(x, c.inputs[2], axis, block);
  bool f32 = x.dtype == DType::F32; // divide in the input's precision, as the reference does
  if (dtypeIsNarrowFloat(y.dtype)) { // no rounding to integers: the narrow float cast rounds
    bool saturateOut = c.attrs.getInt("saturate", 1) != 0;
    for (size_t i = 0; i < v.size(); ++i)
      y.as<uint8_t>()[i] = floatToFloat8(float((f32 ? double(float(v[i]) / float(scale[i])) : v[i] / scale[i]) + zp[i]),
                                         y.dtype, saturateOut);
    return Status::ok();
  }
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = (f32 ? double(std::nearbyint(float(v[i]) / float(scale[i]))) : std::nearbyint(v[i] / scale[i])) + zp[i];
  return storeQuantized(v, y);
}

Status DequantizeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", 1), block = c.attrs.getInt("block_size", 0);
  std::vector<double> scale = broadcastAlong(x, c.inputs[1], axis, block);
  std::vector<double> v = centered(x, c.hasInput(2) ? &c.inputs[2] : nullptr, axis, block);
  if (dtypeIsHalf(y.dtype)) { // storage types: round once from f32
    for (size_t i = 0; i < v.size(); ++i) {
      float f = float(v[i] * scale[i]);
      y.as<uint16_t>()[i] = y.dtype == DType::F16 ? floatToHalf(f) : floatToBf16(f);
    }
    return Status::ok();
  }
  return dispatchFloat(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (size_t i = 0; i < v.size(); ++i) y.as<T>()[i] = T(v[i] * scale[i]);
    return Status::ok();
  });
}

Status DynamicQuantizeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  // float32 arithmetic throughout, as the ONNX definition: rounding of
  // x / scale must match at .5 boundaries.
  const float *px = x.as<float>();
  float lo = 0, hi = 0;
  for (int64_t i = 0, n = x.numElements(); i < n; ++i) {
    lo = std::min(lo, px[i]);
    hi = std::max(hi, px[i]);
  }
  float scale = (hi - lo) / 255.0f;
  if (scale == 0) scale = 1;
  float zp = std::clamp(std::nearbyint(-lo / scale), 0.0f, 255.0f);
  std::vector<double> v(size_t(x.numElements()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(std::nearbyint(px[i] / scale) + zp);
  SD_RETURN_IF_ERROR(storeQuantized(v, c.outputs[0]));
  c.outputs[1].as<float>()[0] = float(scale);
  c.outputs[2].as<uint8_t>()[0] = uint8_t(zp);
  return Status::ok();
}

// The requantization multiplier a_scale * b_scale / y_scale, rounded to f32 at
// each step as ONNX's reference and ONNX Runtime compute it: in double, a sum
// that lands near .5 can round the other way.
double requantScale(double aScale, double bScale, double yScale) {
  return double(float(float(aScale) * float(bScale)) / float(yScale));
}

// (a - azp) x (b - bzp) in double; azp per row of a, bzp per column of b.
Status integerProduct(const TensorView &a, const TensorView *azp, const TensorView &b, const TensorView *bzp,
                      const Dims &outDims, std::vector<double> &out) {
  std::vector<double> av = centered(a, azp, a.rank() >= 2 ? a.rank() - 2 : 0);
  std::vector<double> bv = centered(b, bzp, b.rank() - 1);
  out.assign(size_t(product(outDims)), 0.0);
  return runOp("MatMul", {}, {TensorView{av.data(), DType::F64, a.dims}, TensorView{bv.data(), DType::F64, b.dims}},
               TensorView{out.data(), DType::F64, outDims});
}

Status MatMulIntegerKernel(const KernelContext &c) {
  std::vector<double> out;
  SD_RETURN_IF_ERROR(integerProduct(c.inputs[0], c.hasInput(2) ? &c.inputs[2] : nullptr, c.inputs[1],
                                    c.hasInput(3) ? &c.inputs[3] : nullptr, c.outputs[0].dims, out));
  return storeQuantized(out, c.outputs[0]);
}

Status QLinearMatMulKernel(const KernelContext &c) {
  std::vector<double> out;
  SD_RETURN_IF_ERROR(integerProduct(c.inputs[0], &c.inputs[2], c.inputs[3], &c.inputs[5], c.outputs[0].dims, out));
  std::vector<double> as, bs, ys, yz;
  readDoubles(c.inputs[1], as);
  readDoubles(c.inputs[4], bs);
  readDoubles(c.inputs[6], ys);
  readDoubles(c.inputs[7], yz);
  SD_CHECK_ARG(as.size() == 1 && bs.size() == 1 && ys.size() == 1 && yz.size() == 1,
               "QLinearMatMul supports per-tensor scales");
  double mult = requantScale(as[0], bs[0], ys[0]);
  for (double &v : out) v = std::nearbyint(v * mult) + yz[0];
  return storeQuantized(out, c.outputs[0]);
}

Status integerConv(const KernelContext &c, const TensorView &x, const TensorView *xzp, const TensorView &w,
                   const TensorView *wzp, std::vector<double> &out) {
  std::vector<double> xv = centered(x, xzp, 1), wv = centered(w, wzp, 0);
  out.assign(size_t(c.outputs[0].numElements()), 0.0);
  return runOp("Conv", c.attrs,
               {TensorView{xv.data(), DType::F64, x.dims}, TensorView{wv.data(), DType::F64, w.dims}, TensorView{}},
               TensorView{out.data(), DType::F64, c.outputs[0].dims});
}

Status ConvIntegerKernel(const KernelContext &c) {
  std::vector<double> out;
  SD_RETURN_IF_ERROR(integerConv(c, c.inputs[0], c.hasInput(2) ? &c.inputs[2] : nullptr, c.inputs[1],
                                 c.hasInput(3) ? &c.inputs[3] : nullptr, out));
  return storeQuantized(out, c.outputs[0]);
}

Status QLinearConvKernel(const KernelContext &c) {
  std::vector<double> out;
  SD_RETURN_IF_ERROR(integerConv(c, c.inputs[0], &c.inputs[2], c.inputs[3], &c.inputs[5], out));
  std::vector<double> xs, ws, ys, yz, bias;
  readDoubles(c.inputs[1], xs);
  readDoubles(c.inputs[4], ws);
  readDoubles(c.inputs[6], ys);
  readDoubles(c.inputs[7], yz);
  if (c.hasInput(8) && c.inputs[8].data) readDoubles(c.inputs[8], bias);
  const Dims &od = c.outputs[0].dims;
  int64_t m = od[1], inner = product(od) / std::max<int64_t>(od[0] * m, 1);
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t ch = (int64_t(i) / inner) % m;
    double v = out[i] + (bias.empty() ? 0.0 : bias[size_t(ch)]);
    out[i] = std::nearbyint(v * requantScale(xs[0], ws[ws.size() == 1 ? 0 : size_t(ch)], ys[0])) + yz[0];
  }
  return storeQuantized(out, c.outputs[0]);
}

} // namespace

void registerQuantizedKernels() {
  registerCpuKernel("QuantizeLinear", QuantizeKernel, TypeSet::floats());
  registerCpuKernel("DequantizeLinear", DequantizeKernel, TypeSet{DType::I8, DType::U8, DType::I16, DType::U16, DType::I32} | TypeSet::narrow());
  registerCpuKernel("DynamicQuantizeLinear", DynamicQuantizeKernel, TypeSet{DType::F32});
  registerCpuKernel("MatMulInteger", MatMulIntegerKernel, TypeSet{DType::I8, DType::U8});
  registerCpuKernel("QLinearMatMul", QLinearMatMulKernel, TypeSet{DType::I8, DType::U8});
  registerCpuKernel("ConvInteger", ConvIntegerKernel, TypeSet{DType::I8, DType::U8});
  registerCpuKernel("QLinearConv", QLinearConvKernel, TypeSet{DType::I8, DType::U8});
}

} // namespace sd::cpu
