// CUDA kernels of QuantizeLinear and DequantizeLinear to and from the 8- to
// 32-bit integers (see kernels/cpu/quantized.cc, whose math they follow):
// per-tensor, per-axis or blocked scales and zero points, one thread per
// element; and DynamicQuantizeLinear. The narrow types (4- and 2-bit
// integers, the 8-bit floats) are left to the CPU kernels (the registry says
// these kernels do not produce them). The integer products are in
// integer_products.cu.
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "saturate.cuh"
#include "sd/ops/index_geometry.h"
#include <type_traits>

namespace sd::cuda {
namespace {

// Where element i of the data finds its scale and zero point.
struct ParamLayout {
  bool perTensor = true;
  int64_t len = 1, inner = 1, block = 0, blocks = 0;
  __device__ int64_t at(int64_t i) const {
    if (perTensor) return 0;
    const int64_t a = (i / inner) % len;
    if (block == 0) return a;
    return ((i / (inner * len)) * blocks + a / block) * inner + i % inner;
  }
};

StatusOr<ParamLayout> paramLayout(const KernelContext &c, const TensorView &data, const TensorView &scale) {
  ParamLayout p;
  int64_t axis = c.attrs.getInt("axis", 1);
  p.block = c.attrs.getInt("block_size", 0);
  if (scale.numElements() == 1 && p.block == 0) return p;
  if (axis < 0) axis += data.rank();
  if (axis < 0 || axis >= data.rank()) return sdError("the quantization axis is out of range");
  const AxisExtent e = extentAround(data.dims, axis);
  p.perTensor = false;
  p.len = e.len;
  p.inner = e.inner;
  p.blocks = p.block > 0 ? (e.len + p.block - 1) / p.block : 0;
  const int64_t expected = p.block > 0 ? e.outer * p.blocks * e.inner : e.len;
  if (scale.numElements() != expected)
    return sdError("the scale has ", scale.numElements(), " values where this layout needs ", expected);
  return p;
}

template <typename Q, typename S, typename Y>
__global__ void dequantizeKernel(const Q *x, const S *scale, const Q *zero, Y *y, ParamLayout p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = p.at(i);
    const double v = double(x[i]) - (zero ? double(zero[k]) : 0.0);
    y[i] = store<Y>(Compute<Y>(v * double(load(scale[k]))));
  }
}

// f32 data divides in f32, as the CPU (and ONNX's reference) does; the others in f64.
template <typename X, typename S, typename Q>
__global__ void quantizeKernel(const X *x, const S *scale, const Q *zero, Q *y, ParamLayout p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = p.at(i);
    double q;
    if constexpr (std::is_same_v<X, float>) q = double(nearbyintf(x[i] / float(load(scale[k]))));
    else q = nearbyint(double(load(x[i])) / double(load(scale[k])));
    y[i] = saturate<Q>(q + (zero ? double(zero[k]) : 0.0));
  }
}

template <typename F> Status dispatchQuantized(DType t, F &&f) {
  switch (t) {
  case DType::I8: return f(int8_t{});
  case DType::U8: return f(uint8_t{});
  case DType::I16: return f(int16_t{});
  case DType::U16: return f(uint16_t{});
  case DType::I32: return f(int32_t{});
  default: return sdError("no CUDA kernel quantizes to ", dtypeName(t));
  }
}

// The zero point (null when absent), which must have the quantized type and the scale's count.
StatusOr<const void *> zeroPoint(const KernelContext &c, const TensorView &quantized, const TensorView &scale) {
  if (!c.hasInput(2) || !c.inputs[2].data) return static_cast<const void *>(nullptr);
  const TensorView &z = c.inputs[2];
  if (z.dtype != quantized.dtype || z.numElements() != scale.numElements())
    return sdError("the zero point must have the quantized type and as many values as the scale");
  return z.data;
}

Status DequantizeLinearKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &scale = c.inputs[1], &y = c.outputs[0];
  StatusOr<ParamLayout> p = paramLayout(c, x, scale);
  if (!p.isOk()) return p.status().withContext("DequantizeLinear: ");
  StatusOr<const void *> zero = zeroPoint(c, x, scale);
  if (!zero.isOk()) return zero.status().withContext("DequantizeLinear: ");
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  return dispatchQuantized(x.dtype, [&](auto qtag) {
    using Q = decltype(qtag);
    return dispatchFloatStorage(scale.dtype, [&](auto stag) {
      using S = decltype(stag);
      return dispatchFloatStorage(y.dtype, [&](auto ytag) {
        using Y = decltype(ytag);
        dequantizeKernel<Q, S, Y><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(
            x.as<Q>(), scale.as<S>(), static_cast<const Q *>(zero.value()), y.as<Y>(), *p, n);
        return launchStatus("DequantizeLinear");
      });
    });
  });
}

Status QuantizeLinearKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &scale = c.inputs[1], &y = c.outputs[0];
  StatusOr<ParamLayout> p = paramLayout(c, x, scale);
  if (!p.isOk()) return p.status().withContext("QuantizeLinear: ");
  StatusOr<const void *> zero = zeroPoint(c, y, scale);
  if (!zero.isOk()) return zero.status().withContext("QuantizeLinear: ");
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto xtag) {
    using X = decltype(xtag);
    return dispatchFloatStorage(scale.dtype, [&](auto stag) {
      using S = decltype(stag);
      return dispatchQuantized(y.dtype, [&](auto qtag) {
        using Q = decltype(qtag);
        quantizeKernel<X, S, Q><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(
            x.as<X>(), scale.as<S>(), static_cast<const Q *>(zero.value()), y.as<Q>(), *p, n);
        return launchStatus("QuantizeLinear");
      });
    });
  });
}

// DynamicQuantizeLinear: x's range (with 0) in one block, std::min/max's
// choices so NaN is skipped and any tree gives the same bounds; then
// scale = (hi - lo) / 255 (1 when 0) and zero = clamp(round(-lo / scale)),
// all in f32 as the ONNX definition; then one thread per element quantizes.
struct MinKeep {
  __device__ float operator()(float a, float b) const { return b < a ? b : a; }
};
struct MaxKeep {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }
};

constexpr int kRangeThreads = 1024;

__global__ void dynamicRangeKernel(const float *x, int64_t n, float *scaleOut, uint8_t *zeroOut) {
  float lo = 0, hi = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) lo = MinKeep()(lo, x[i]), hi = MaxKeep()(hi, x[i]);
  lo = blockReduce(lo, MinKeep(), 0.0f);
  hi = blockReduce(hi, MaxKeep(), 0.0f);
  if (threadIdx.x != 0) return;
  float scale = (hi - lo) / 255.0f;
  if (scale == 0) scale = 1;
  const float zero = nearbyintf(-lo / scale);
  *scaleOut = scale;
  *zeroOut = uint8_t(zero < 0.0f ? 0.0f : zero > 255.0f ? 255.0f : zero);
}

__global__ void dynamicQuantizeKernel(const float *x, const float *scale, const uint8_t *zero, uint8_t *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = saturate<uint8_t>(double(nearbyintf(x[i] / *scale) + float(*zero)));
}

Status DynamicQuantizeLinearKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  if (y.dtype != DType::U8 || c.outputs[1].dtype != DType::F32 || c.outputs[2].dtype != DType::U8)
    return sdError("DynamicQuantizeLinear gives u8 data, an f32 scale and a u8 zero point");
  const int64_t n = x.numElements();
  float *scale = c.outputs[1].as<float>();
  uint8_t *zero = c.outputs[2].as<uint8_t>();
  dynamicRangeKernel<<<1, kRangeThreads, 0, streamOf(c)>>>(x.as<float>(), n, scale, zero);
  if (n > 0) dynamicQuantizeKernel<<<blocksFor(n), kThreads, 0, streamOf(c)>>>(x.as<float>(), scale, zero, y.as<uint8_t>(), n);
  return launchStatus("DynamicQuantizeLinear");
}

} // namespace

void registerQuantizedKernels() {
  const TypeSet quantized{DType::I8, DType::U8, DType::I16, DType::U16, DType::I32};
  registerKernel("DequantizeLinear", DequantizeLinearKernel, quantized, nullptr, 0, floatStorage());
  registerKernel("QuantizeLinear", QuantizeLinearKernel, floatStorage(), nullptr, 0, quantized);
  registerKernel("DynamicQuantizeLinear", DynamicQuantizeLinearKernel, {DType::F32});
}

} // namespace sd::cuda
