// CUDA kernels of QuantizeLinear and DequantizeLinear to and from the 8- to
// 32-bit integers (see kernels/cpu/quantized.cc, whose math they follow):
// per-tensor, per-axis or blocked scales and zero points, one thread per
// element. The narrow types (4- and 2-bit integers, the 8-bit floats) are
// left to the CPU kernels (the registry says these kernels do not produce
// them), as are the integer products.
#include "cuda_util.cuh"
#include "sd/ops/index_geometry.h"
#include <cuda/std/limits>
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

template <typename Q> __device__ inline Q saturate(double v) {
  v = nearbyint(v);
  const double lo = double(::cuda::std::numeric_limits<Q>::lowest()), hi = double(::cuda::std::numeric_limits<Q>::max());
  return Q(v < lo ? lo : (v > hi ? hi : v));
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

} // namespace

void registerQuantizedKernels() {
  const TypeSet quantized{DType::I8, DType::U8, DType::I16, DType::U16, DType::I32};
  registerKernel("DequantizeLinear", DequantizeLinearKernel, quantized, nullptr, 0, floatStorage());
  registerKernel("QuantizeLinear", QuantizeLinearKernel, floatStorage(), nullptr, 0, quantized);
}

} // namespace sd::cuda
