// CUDA kernels that generate, scan or mask values (see
// kernels/cpu/generators.cc): Shape, Size, ConstantOfShape, EyeLike, Range and
// the Hann, Hamming and Blackman windows; CumSum and
// CumProd, one thread per line along the axis adding in the CPU kernel's
// order (so the bits match it, and no scan tree depends on the launch);
// Trilu. Their axis and k operands are constants, read when the session is
// created: the host cannot look at device values without a sync. Range's
// start and delta are read on the device, so they may change per run.
#include "cuda_util.cuh"
#include "integer_dispatch.cuh"
#include "sd/ops/math/windows.h"
#include "sd/format/dtype.h"
#include "sd/ops/dispatch.h"
#include "sd/ops/index_geometry.h"
#include <algorithm>
#include <cstring>
#include <memory>

namespace sd::cuda {
namespace {

// A constant scalar integer operand, read at prepare (CumSum's axis, Trilu's k).
struct ScalarPrepared : PreparedError {
  int64_t value = 0;
};

std::shared_ptr<const void> prepareScalar(const PrepareContext &p, size_t operand, int64_t absent, const char *what) {
  auto s = std::make_shared<ScalarPrepared>();
  std::vector<int64_t> v;
  if (!hostIntegers(p, operand, v)) s->error = std::string(what) + " on CUDA must be a constant";
  else if (v.size() > 1) s->error = std::string(what) + " must be a single integer";
  else s->value = v.empty() ? absent : v[0];
  return s;
}

StatusOr<int64_t> preparedScalar(const KernelContext &c, const char *op) {
  auto *s = static_cast<const ScalarPrepared *>(c.prepared);
  if (!s) return sdError(op, " was not prepared");
  if (!s->error.empty()) return sdError(op, ": ", s->error);
  return s->value;
}

template <bool Product, typename T>
__global__ void cumulativeKernel(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, bool exclusive,
                                 bool reverse) {
  for (int64_t line = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; line < outer * inner;
       line += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (line / inner) * n * inner + line % inner;
    Compute<T> acc = Compute<T>(Product ? 1 : 0);
    for (int64_t jj = 0; jj < n; ++jj) {
      const int64_t off = base + (reverse ? n - 1 - jj : jj) * inner;
      const Compute<T> v = load(x[off]);
      if (exclusive) y[off] = store<T>(acc);
      acc = Product ? acc * v : acc + v;
      if (!exclusive) y[off] = store<T>(acc);
    }
  }
}

template <bool Product> Status cumulative(const KernelContext &c) {
  const char *op = Product ? "CumProd" : "CumSum";
  StatusOr<int64_t> axisOr = preparedScalar(c, op);
  if (!axisOr.isOk()) return axisOr.status();
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t axis = axisOr.value();
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank()) return sdError(op, " axis out of range");
  const AxisExtent ext = extentAround(x.dims, axis);
  const int64_t lines = ext.outer * ext.inner;
  if (lines == 0 || ext.len == 0) return Status::ok();
  const bool exclusive = c.attrs.getInt("exclusive", 0) != 0, reverse = c.attrs.getInt("reverse", 0) != 0;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    cumulativeKernel<Product, T><<<blocksFor(lines), kThreads, 0, streamOf(c)>>>(
        x.as<T>(), y.as<T>(), ext.outer, ext.len, ext.inner, exclusive, reverse);
    return launchStatus(op);
  };
  if (x.dtype == DType::I64) return launch(int64_t{});
  if (x.dtype == DType::I32) return launch(int32_t{});
  return dispatchFloatStorage(x.dtype, launch);
}

std::shared_ptr<const void> prepareCumulative(const PrepareContext &p) { return prepareScalar(p, 1, 0, "the axis"); }

// Trilu: elements on the kept side of diagonal k copied, the rest zero.
template <typename U>
__global__ void triluKernel(const U *x, U *y, int64_t n, int64_t rows, int64_t cols, int64_t k, bool upper) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = i % cols, row = (i / cols) % rows;
    const bool keep = upper ? col - row >= k : col - row <= k;
    y[i] = keep ? x[i] : U{};
  }
}

Status TriluKernel(const KernelContext &c) {
  StatusOr<int64_t> k = preparedScalar(c, "Trilu");
  if (!k.isOk()) return k.status();
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  if (x.rank() < 2) return sdError("Trilu needs a tensor of rank 2 or more");
  const int64_t n = y.numElements(), rows = x.dims[size_t(x.rank() - 2)], cols = x.dims.back();
  if (n == 0) return Status::ok();
  const bool upper = c.attrs.getInt("upper", 1) != 0;
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    triluKernel<U><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(x.as<U>(), y.as<U>(), n, rows, cols, k.value(), upper);
    return launchStatus("Trilu");
  });
}

std::shared_ptr<const void> prepareTrilu(const PrepareContext &p) { return prepareScalar(p, 1, 0, "Trilu's k"); }

// `v` as one element of type t, converted as the CPU kernels convert
// ConstantOfShape's value (bool: not zero; halves: rounded from f32).
StatusOr<uint64_t> elementBits(DType t, double v) {
  uint64_t bits = 0;
  auto put = [&](auto x) {
    std::memcpy(&bits, &x, sizeof x);
    return bits;
  };
  switch (t) {
  case DType::Bool: return put(uint8_t(v != 0));
  case DType::F16: return put(floatToHalf(float(v)));
  case DType::BF16: return put(floatToBf16(float(v)));
  case DType::F32: return put(float(v));
  case DType::F64: return put(v);
  case DType::I64: return put(int64_t(v));
  case DType::I32: return put(int32_t(v));
  case DType::I16: return put(int16_t(v));
  case DType::I8: return put(int8_t(v));
  case DType::U64: return put(uint64_t(v));
  case DType::U32: return put(uint32_t(v));
  case DType::U16: return put(uint16_t(v));
  case DType::U8: return put(uint8_t(v));
  default: return sdError("no CUDA kernel makes elements of type ", dtypeName(t));
  }
}

template <typename U> __global__ void fillKernel(U *y, U value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = value;
}

Status ConstantOfShapeKernel(const KernelContext &c) {
  const TensorView &y = c.outputs[0];
  const int64_t n = y.numElements();
  StatusOr<uint64_t> bits = elementBits(y.dtype, c.attrs.getFloat("value", 0.0));
  if (!bits.isOk()) return bits.status();
  if (n == 0) return Status::ok();
  return dispatchByWidth(y.dtype, [&](auto tag) {
    using U = decltype(tag);
    fillKernel<U><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(y.as<U>(), U(bits.value()), n);
    return launchStatus("ConstantOfShape");
  });
}

// EyeLike: zeros, and one on diagonal k of the [rows, cols] result.
template <typename U> __global__ void diagonalKernel(U *y, U one, int64_t rows, int64_t cols, int64_t k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows; i += int64_t(gridDim.x) * blockDim.x)
    if (i + k >= 0 && i + k < cols) y[i * cols + i + k] = one;
}

Status EyeLikeKernel(const KernelContext &c) {
  const TensorView &y = c.outputs[0];
  if (y.rank() != 2) return sdError("EyeLike makes a matrix, not a tensor of rank ", y.rank());
  StatusOr<uint64_t> one = elementBits(y.dtype, 1.0);
  if (!one.isOk()) return one.status();
  if (y.numElements() == 0) return Status::ok();
  if (cudaMemsetAsync(y.data, 0, y.byteSize(), streamOf(c)) != cudaSuccess) return launchStatus("EyeLike");
  const int64_t rows = y.dims[0], cols = y.dims[1], k = c.attrs.getInt("k", 0);
  return dispatchByWidth(y.dtype, [&](auto tag) {
    using U = decltype(tag);
    diagonalKernel<U><<<blocksFor(rows), kThreads, 0, streamOf(c)>>>(y.as<U>(), U(one.value()), rows, cols, k);
    return launchStatus("EyeLike");
  });
}

// Range: start + i * delta in the element type, the product rounded before
// the sum as on the CPU (no fused multiply-add).
template <typename T> __device__ inline T rangeAt(T start, int64_t i, T delta) {
  if constexpr (std::is_same_v<T, float>) return __fadd_rn(start, __fmul_rn(float(i), delta));
  else if constexpr (std::is_same_v<T, double>) return __dadd_rn(start, __dmul_rn(double(i), delta));
  else return T(start + T(i) * delta);
}

template <typename T> __global__ void rangeKernel(const T *start, const T *delta, T *y, int64_t n) {
  const T s = *start, d = *delta;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = rangeAt(s, i, d);
}

Status RangeKernel(const KernelContext &c) {
  const TensorView &y = c.outputs[0];
  for (size_t i : {0, 2})
    if (c.inputs.size() <= i || c.inputs[i].dtype != y.dtype || c.inputs[i].numElements() != 1)
      return sdError("Range's start and delta must be single values of the result's type");
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    rangeKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(c.inputs[0].as<T>(), c.inputs[2].as<T>(), y.as<T>(), n);
    return launchStatus("Range");
  };
  return dispatchInteger(y.dtype, launch, [&](DType other) {
    if (other == DType::F32) return launch(float{});
    if (other == DType::F64) return launch(double{});
    return sdError("no CUDA Range for ", dtypeName(other));
  });
}

// Shape and Size: values the host knows when it launches, written by a
// kernel that takes them by value (capturable, unlike a copy from host memory).
__global__ void writeIntegersKernel(Shape8 values, int64_t *out) {
  if (threadIdx.x < values.rank) out[threadIdx.x] = values.dims[threadIdx.x];
}

Status ShapeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t r = x.rank(), s = c.attrs.getInt("start", 0), e = c.attrs.getInt("end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  if (y.numElements() != std::max<int64_t>(0, e - s) || y.dtype != DType::I64 || e - s > kMaxRank)
    return sdError("Shape output ", formatDims(y.dims), " does not hold dims ", s, " to ", e, " of a rank-", r, " input");
  Shape8 values;
  for (int64_t i = s; i < e; ++i) values.dims[values.rank++] = x.dims[size_t(i)];
  if (values.rank == 0) return Status::ok();
  writeIntegersKernel<<<1, 32, 0, streamOf(c)>>>(values, y.as<int64_t>());
  return launchStatus("Shape");
}

Status SizeKernel(const KernelContext &c) {
  if (c.outputs[0].dtype != DType::I64 || c.outputs[0].numElements() != 1) return sdError("Size gives one i64");
  Shape8 values;
  values.rank = 1;
  values.dims[0] = c.inputs[0].numElements();
  writeIntegersKernel<<<1, 32, 0, streamOf(c)>>>(values, c.outputs[0].as<int64_t>());
  return launchStatus("Size");
}

// ONNX's windows over their n = result size points: N = n when periodic,
// n - 1 when symmetric (sd/ops/math/windows.h, the CPU kernels' values).
template <math::Window Kind, typename T> __global__ void windowKernel(T *y, int64_t n, double N) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = T(math::windowValue(Kind, i, N));
}

template <math::Window Kind> Status windowOp(const KernelContext &c) {
  const TensorView &y = c.outputs[0];
  const int64_t n = y.numElements();
  const double N = c.attrs.getInt("periodic", 1) ? double(n) : double(n - 1);
  if (n == 0) return Status::ok();
  if (y.dtype == DType::F64) windowKernel<Kind, double><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(y.as<double>(), n, N);
  else if (y.dtype == DType::F32) windowKernel<Kind, float><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(y.as<float>(), n, N);
  else return sdError("the windows on CUDA are f32 or f64");
  return launchStatus("window");
}

} // namespace

void registerGeneratorKernels() {
  registerKernel("Shape", ShapeKernel, TypeSet::all());
  registerKernel("Size", SizeKernel, TypeSet::all());
  registerKernel("HannWindow", windowOp<math::Window::Hann>, {DType::F32, DType::F64}, nullptr, -1);
  registerKernel("HammingWindow", windowOp<math::Window::Hamming>, {DType::F32, DType::F64}, nullptr, -1);
  registerKernel("BlackmanWindow", windowOp<math::Window::Blackman>, {DType::F32, DType::F64}, nullptr, -1);
  registerKernel("ConstantOfShape", ConstantOfShapeKernel, TypeSet::all(), nullptr, -1);
  registerKernel("EyeLike", EyeLikeKernel, TypeSet::numeric() | TypeSet{DType::Bool}, nullptr, -1);
  registerKernel("Range", RangeKernel, TypeSet::numeric());
  const TypeSet scanned = floatStorage() | TypeSet{DType::I64, DType::I32};
  registerKernel("CumSum", cumulative<false>, scanned, prepareCumulative);
  registerKernel("CumProd", cumulative<true>, scanned, prepareCumulative);
  registerKernel("Trilu", TriluKernel, TypeSet::all(), prepareTrilu);
}

} // namespace sd::cuda
