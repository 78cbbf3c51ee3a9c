// CUDA kernels for the integers' bit operations: BitwiseAnd, BitwiseOr,
// BitwiseXor and BitwiseNot, and BitShift (sd/ops/math/integer.h, the CPU's
// math), with numpy broadcasting, on every integer type.
#include "broadcast.cuh"
#include "cuda_util.cuh"
#include "integer_dispatch.cuh"
#include "sd/ops/math/integer.h"

namespace sd::cuda {
namespace {

enum class Bits { And, Or, Xor, ShiftLeft, ShiftRight };

template <Bits Op, typename T> __device__ inline T applyBits(T a, T b) {
  if constexpr (Op == Bits::And) return T(a & b);
  else if constexpr (Op == Bits::Or) return T(a | b);
  else if constexpr (Op == Bits::Xor) return T(a ^ b);
  else return math::bitShift(a, b, Op == Bits::ShiftLeft);
}

template <Bits Op, typename T> __global__ void bitsKernel(Broadcast bc, const T *a, const T *b, T *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t ia, ib, unused;
    offsets(bc, i, ia, ib, unused);
    y[i] = applyBits<Op>(a[ia], b[ib]);
  }
}

template <typename F> Status dispatchBits(DType t, const char *op, F &&f) {
  return dispatchInteger(t, f, [op](DType other) { return sdError(op, " needs integers, got ", dtypeName(other)); });
}

template <Bits Op> Status launchBits(const KernelContext &c, const char *op) {
  const TensorView &a = c.inputs[0], &b = c.inputs[1], &y = c.outputs[0];
  if (a.dtype != b.dtype || a.dtype != y.dtype) return sdError(op, " operands differ in element type");
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  StatusOr<Broadcast> bc = broadcastOf(y.dims, {&a.dims, &b.dims});
  if (!bc.isOk()) return bc.status();
  return dispatchBits(a.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    bitsKernel<Op, T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(*bc, a.as<T>(), b.as<T>(), y.as<T>(), n);
    return launchStatus(op);
  });
}

Status BitShiftKernel(const KernelContext &c) {
  const std::string direction = c.attrs.getString("direction", "LEFT");
  if (direction != "LEFT" && direction != "RIGHT")
    return sdError("BitShift direction must be LEFT or RIGHT, got '", direction, "'");
  return direction == "LEFT" ? launchBits<Bits::ShiftLeft>(c, "BitShift") : launchBits<Bits::ShiftRight>(c, "BitShift");
}

template <typename T> __global__ void bitwiseNotKernel(const T *x, T *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = T(~x[i]);
}

Status BitwiseNotKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  return dispatchBits(x.dtype, "BitwiseNot", [&](auto tag) {
    using T = decltype(tag);
    bitwiseNotKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(x.as<T>(), y.as<T>(), n);
    return launchStatus("BitwiseNot");
  });
}

} // namespace

void registerBitwiseKernels() {
  const TypeSet integers = TypeSet::integers();
  registerKernel("BitwiseAnd", [](const KernelContext &c) { return launchBits<Bits::And>(c, "BitwiseAnd"); }, integers);
  registerKernel("BitwiseOr", [](const KernelContext &c) { return launchBits<Bits::Or>(c, "BitwiseOr"); }, integers);
  registerKernel("BitwiseXor", [](const KernelContext &c) { return launchBits<Bits::Xor>(c, "BitwiseXor"); }, integers);
  registerKernel("BitwiseNot", BitwiseNotKernel, integers);
  registerKernel("BitShift", BitShiftKernel, integers);
}

} // namespace sd::cuda
