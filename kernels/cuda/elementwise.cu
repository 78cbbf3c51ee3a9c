// CUDA kernels of the elementwise family: unary math and activations (the
// shared sd::math functions), broadcasting binary arithmetic, GeluGrad,
// comparisons and logic, Not, IsNaN, IsInf, Clip, Where, Cast and CastLike,
// and Dropout at inference. Grid-stride loops; f16/bf16 compute in f32.
#include "broadcast.cuh"
#include "cuda_util.cuh"
#include "integer_dispatch.cuh"
#include "sd/ops/dispatch.h"
#include "sd/ops/math/activations.h"
#include "tensor_table.cuh"
#include <cmath>
#include <cuda/std/limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace sd::cuda {
namespace {

enum class Unary { Relu, Sigmoid, GeluErf, GeluTanh, Neg, Abs, Exp, Log, Sqrt, Tanh, Reciprocal, Erf, Softplus, Sin,
                   Cos, Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh, HardSigmoid, HardSwish, LeakyRelu,
                   Elu, Selu, Celu, ThresholdedRelu, Softsign, Mish, Swish, Floor, Ceil, Round, Sign, Shrink,
                   DivideBy, Identity };

// The attributes a unary op reads (ONNX's names; Shrink's lambd and bias as alpha and beta).
struct UnaryParams {
  double alpha = 0, beta = 0, gamma = 0;
};

template <Unary Op, typename C> __device__ inline C applyUnary(C x, const UnaryParams &p) {
  const C alpha = C(p.alpha), beta = C(p.beta), gamma = C(p.gamma);
  if constexpr (Op == Unary::Relu) return math::relu(x);
  else if constexpr (Op == Unary::Sigmoid) return math::sigmoid(x);
  else if constexpr (Op == Unary::GeluErf) return math::geluErf(x);
  else if constexpr (Op == Unary::GeluTanh) return math::geluTanh(x);
  else if constexpr (Op == Unary::Neg) return -x;
  else if constexpr (Op == Unary::Abs) return std::fabs(x);
  else if constexpr (Op == Unary::Exp) return std::exp(x);
  else if constexpr (Op == Unary::Log) return std::log(x);
  else if constexpr (Op == Unary::Sqrt) return std::sqrt(x);
  else if constexpr (Op == Unary::Tanh) return std::tanh(x);
  else if constexpr (Op == Unary::Reciprocal) return C(1) / x;
  else if constexpr (Op == Unary::Erf) return std::erf(x);
  else if constexpr (Op == Unary::Softplus) return math::softplus(x);
  else if constexpr (Op == Unary::Sin) return std::sin(x);
  else if constexpr (Op == Unary::Cos) return std::cos(x);
  else if constexpr (Op == Unary::Tan) return std::tan(x);
  else if constexpr (Op == Unary::Asin) return std::asin(x);
  else if constexpr (Op == Unary::Acos) return std::acos(x);
  else if constexpr (Op == Unary::Atan) return std::atan(x);
  else if constexpr (Op == Unary::Sinh) return std::sinh(x);
  else if constexpr (Op == Unary::Cosh) return std::cosh(x);
  else if constexpr (Op == Unary::Asinh) return std::asinh(x);
  else if constexpr (Op == Unary::Acosh) return std::acosh(x);
  else if constexpr (Op == Unary::Atanh) return std::atanh(x);
  else if constexpr (Op == Unary::HardSigmoid) return math::hardSigmoid(x, alpha, beta);
  else if constexpr (Op == Unary::HardSwish) return math::hardSwish(x);
  else if constexpr (Op == Unary::LeakyRelu) return math::leakyRelu(x, alpha);
  else if constexpr (Op == Unary::Elu) return math::elu(x, alpha);
  else if constexpr (Op == Unary::Selu) return math::selu(x, alpha, gamma);
  else if constexpr (Op == Unary::Celu) return math::celu(x, alpha);
  else if constexpr (Op == Unary::ThresholdedRelu) return math::thresholdedRelu(x, alpha);
  else if constexpr (Op == Unary::Softsign) return math::softsign(x);
  else if constexpr (Op == Unary::Mish) return math::mish(x);
  else if constexpr (Op == Unary::Swish) return math::swish(x, alpha);
  else if constexpr (Op == Unary::Floor) return std::floor(x);
  else if constexpr (Op == Unary::Ceil) return std::ceil(x);
  else if constexpr (Op == Unary::Round) return std::nearbyint(x); // half to even, as the CPU's
  else if constexpr (Op == Unary::Sign) return math::sign(x);
  else if constexpr (Op == Unary::Shrink) return C(math::shrink(double(x), p.alpha, p.beta)); // in f64, as the CPU
  else if constexpr (Op == Unary::DivideBy) return x / alpha; // Mean's last step
  else return x;
}

template <Unary Op, typename T> __global__ void unaryKernel(const T *x, T *y, int64_t n, UnaryParams p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = store<T>(applyUnary<Op>(load(x[i]), p));
}

template <Unary Op> Status launchUnary(const KernelContext &c, const char *name, UnaryParams p = {}) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    unaryKernel<Op, T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(x.as<T>(), y.as<T>(), n, p);
    return launchStatus(name);
  });
}

#define SD_UNARY(NAME, OP) \
  Status NAME##Kernel(const KernelContext &c) { return launchUnary<Unary::OP>(c, #NAME); }
SD_UNARY(Relu, Relu) SD_UNARY(Sigmoid, Sigmoid) SD_UNARY(Neg, Neg) SD_UNARY(Abs, Abs) SD_UNARY(Exp, Exp)
SD_UNARY(Log, Log) SD_UNARY(Sqrt, Sqrt) SD_UNARY(Tanh, Tanh) SD_UNARY(Reciprocal, Reciprocal) SD_UNARY(Erf, Erf)
SD_UNARY(Softplus, Softplus) SD_UNARY(Sin, Sin) SD_UNARY(Cos, Cos) SD_UNARY(Tan, Tan) SD_UNARY(Asin, Asin)
SD_UNARY(Acos, Acos) SD_UNARY(Atan, Atan) SD_UNARY(Sinh, Sinh) SD_UNARY(Cosh, Cosh) SD_UNARY(Asinh, Asinh)
SD_UNARY(Acosh, Acosh) SD_UNARY(Atanh, Atanh) SD_UNARY(HardSwish, HardSwish) SD_UNARY(Softsign, Softsign)
SD_UNARY(Mish, Mish) SD_UNARY(Floor, Floor) SD_UNARY(Ceil, Ceil) SD_UNARY(Round, Round) SD_UNARY(Sign, Sign)
#undef SD_UNARY

// The attribute defaults are ONNX's (the CPU kernels' in kernels/cpu/elementwise.cc).
#define SD_UNARY_PARAMS(NAME, A, B, G)                                                                      \
  Status NAME##Kernel(const KernelContext &c) {                                                             \
    return launchUnary<Unary::NAME>(c, #NAME, {c.attrs.getFloat("alpha", A), c.attrs.getFloat("beta", B), \
                                               c.attrs.getFloat("gamma", G)});                              \
  }
SD_UNARY_PARAMS(HardSigmoid, 0.2, 0.5, 0) SD_UNARY_PARAMS(LeakyRelu, 0.01, 0, 0) SD_UNARY_PARAMS(Elu, 1.0, 0, 0)
SD_UNARY_PARAMS(Selu, math::kSeluAlpha, 0, math::kSeluGamma) SD_UNARY_PARAMS(Celu, 1.0, 0, 0)
SD_UNARY_PARAMS(ThresholdedRelu, 1.0, 0, 0) SD_UNARY_PARAMS(Swish, 1.0, 0, 0)
#undef SD_UNARY_PARAMS

Status ShrinkKernel(const KernelContext &c) {
  return launchUnary<Unary::Shrink>(c, "Shrink", {c.attrs.getFloat("lambd", 0.5), c.attrs.getFloat("bias", 0.0), 0});
}

Status GeluKernel(const KernelContext &c) {
  if (c.attrs.getString("approximate", "none") == "tanh") return launchUnary<Unary::GeluTanh>(c, "Gelu");
  return launchUnary<Unary::GeluErf>(c, "Gelu");
}

enum class Binary { Add, Sub, Mul, Div, Pow, Max, Min, GeluErfGrad, GeluTanhGrad, PRelu, Mod, Fmod };

template <Binary Op, typename C> __device__ inline C applyBinary(C a, C b) {
  if constexpr (Op == Binary::Add) return a + b;
  else if constexpr (Op == Binary::Sub) return a - b;
  else if constexpr (Op == Binary::Mul) return a * b;
  else if constexpr (Op == Binary::Div) {
    if constexpr (std::is_integral_v<C>) return b == 0 ? C(0) : C(a / b); // undefined in ONNX: 0, as on the CPU
    else return a / b;
  }
  else if constexpr (Op == Binary::Pow) return std::pow(a, b);
  else if constexpr (Op == Binary::Max) return (a != a || b != b) ? a + b : (a > b ? a : b); // NaN propagates
  else if constexpr (Op == Binary::Min) return (a != a || b != b) ? a + b : (a < b ? a : b);
  else if constexpr (Op == Binary::GeluErfGrad) return a * math::geluErfGrad(b); // a = dy, b = x
  else if constexpr (Op == Binary::GeluTanhGrad) return a * math::geluTanhGrad(b);
  else if constexpr (Op == Binary::PRelu) return a < C(0) ? a * b : a; // b: the slope
  else if constexpr (Op == Binary::Mod) return math::mod(a, b, false);
  else return math::mod(a, b, true);
}

template <Binary Op, typename T> __global__ void binaryKernel(Broadcast bc, const T *a, const T *b, T *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t ia, ib, unused;
    offsets(bc, i, ia, ib, unused);
    y[i] = store<T>(applyBinary<Op>(load(a[ia]), load(b[ib])));
  }
}

template <Binary Op>
Status launchBinary(const TensorView &a, const TensorView &b, const TensorView &y, cudaStream_t stream,
                    const char *name) {
  if (a.dtype != b.dtype || a.dtype != y.dtype) return sdError(name, " operands differ in element type");
  int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  StatusOr<Broadcast> bc = broadcastOf(y.dims, {&a.dims, &b.dims});
  if (!bc.isOk()) return bc.status();
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    binaryKernel<Op, T><<<blocksFor(n), kThreads, 0, stream>>>(*bc, a.as<T>(), b.as<T>(), y.as<T>(), n);
    return launchStatus(name);
  };
  // Integer arithmetic: shape and index computations (a detector's box indices).
  constexpr bool integers = Op == Binary::Add || Op == Binary::Sub || Op == Binary::Mul || Op == Binary::Div ||
                            Op == Binary::Max || Op == Binary::Min || Op == Binary::Mod || Op == Binary::Fmod;
  if constexpr (integers) {
    if (a.dtype == DType::I64) return launch(int64_t{});
    if (a.dtype == DType::I32) return launch(int32_t{});
  }
  return dispatchFloatStorage(a.dtype, launch);
}

template <Binary Op> Status launchBinary(const KernelContext &c, const char *name) {
  if (c.inputs.size() != 2) return sdError(name, " on CUDA takes exactly two operands, got ", c.inputs.size());
  return launchBinary<Op>(c.inputs[0], c.inputs[1], c.outputs[0], streamOf(c), name);
}

// ONNX's Max and Min take one or more operands: folded pairwise into y
// (y = op(x0, x1), then y = op(y, xk)). An operand whose memory y reuses
// (a result stored in place) goes first, before y is written.
template <Binary Op> Status launchFold(const KernelContext &c, const char *name) {
  const TensorView &y = c.outputs[0];
  if (c.inputs.empty()) return sdError(name, " takes at least one operand");
  std::vector<const TensorView *> xs;
  for (const TensorView &x : c.inputs) {
    if (x.data == y.data) xs.insert(xs.begin(), &x);
    else xs.push_back(&x);
  }
  if (xs.size() == 1) {
    if (xs[0]->dtype != y.dtype || xs[0]->dims != y.dims) return sdError(name, " of one operand must keep its type and shape");
    return copyTensor(*xs[0], y, streamOf(c), name);
  }
  SD_RETURN_IF_ERROR(launchBinary<Op>(*xs[0], *xs[1], y, streamOf(c), name));
  for (size_t k = 2; k < xs.size(); ++k) SD_RETURN_IF_ERROR(launchBinary<Op>(y, *xs[k], y, streamOf(c), name));
  return Status::ok();
}

#define SD_BINARY(NAME) \
  Status NAME##Kernel(const KernelContext &c) { return launchBinary<Binary::NAME>(c, #NAME); }
SD_BINARY(Add) SD_BINARY(Sub) SD_BINARY(Mul) SD_BINARY(Div) SD_BINARY(Pow)
#undef SD_BINARY
Status MaxKernel(const KernelContext &c) { return launchFold<Binary::Max>(c, "Max"); }
Status MinKernel(const KernelContext &c) { return launchFold<Binary::Min>(c, "Min"); }
Status SumKernel(const KernelContext &c) { return launchFold<Binary::Add>(c, "Sum"); }
// The sum, then divided by the operand count in place (as the CPU: T(sum / T(k))).
Status MeanKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(launchFold<Binary::Add>(c, "Mean"));
  KernelContext scale{c.attrs, {c.outputs[0]}, {c.outputs[0]}, c.pool, nullptr, c.stream, c.comm, c.shardOwner};
  return launchUnary<Unary::DivideBy>(scale, "Mean", {double(c.inputs.size()), 0, 0});
}
Status PReluKernel(const KernelContext &c) { return launchBinary<Binary::PRelu>(c, "PRelu"); }
Status ModKernel(const KernelContext &c) {
  if (c.attrs.getInt("fmod", 0) != 0) return launchBinary<Binary::Fmod>(c, "Mod");
  return launchBinary<Binary::Mod>(c, "Mod");
}

Status GeluGradKernel(const KernelContext &c) {
  if (c.attrs.getString("approximate", "none") == "tanh") return launchBinary<Binary::GeluTanhGrad>(c, "GeluGrad");
  return launchBinary<Binary::GeluErfGrad>(c, "GeluGrad");
}

template <typename T>
__global__ void whereKernel(Broadcast bc, const bool *cond, const T *x, const T *y, T *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t ic, ix, iy;
    offsets(bc, i, ic, ix, iy);
    out[i] = cond[ic] ? x[ix] : y[iy];
  }
}

// Where(cond, x, y) moves bytes, so it runs on every storage type by element size.
Status WhereKernel(const KernelContext &c) {
  const TensorView &cond = c.inputs[0], &x = c.inputs[1], &y = c.inputs[2], &o = c.outputs[0];
  if (cond.dtype != DType::Bool) return sdError("Where's condition must be bool");
  int64_t n = o.numElements();
  if (n == 0) return Status::ok();
  StatusOr<Broadcast> bc = broadcastOf(o.dims, {&cond.dims, &x.dims, &y.dims});
  if (!bc.isOk()) return bc.status();
  auto go = [&](auto tag) {
    using T = decltype(tag);
    whereKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(*bc, cond.as<bool>(), x.as<T>(), y.as<T>(),
                                                                o.as<T>(), n);
    return launchStatus("Where");
  };
  return dispatchByWidth(o.dtype, go);
}

// Comparisons: numeric operands (broadcast) -> bool.
enum class Compare { Equal, Less, Greater, LessOrEqual, GreaterOrEqual, And, Or, Xor };

template <typename T> __device__ inline auto comparable(T x) { return load(x); }
template <> __device__ inline auto comparable(int64_t x) { return x; }
template <> __device__ inline auto comparable(int32_t x) { return x; }
template <> __device__ inline auto comparable(bool x) { return x; }

template <Compare Op, typename T>
__global__ void compareKernel(Broadcast bc, const T *a, const T *b, bool *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t ia, ib, unused;
    offsets(bc, i, ia, ib, unused);
    auto x = comparable(a[ia]), z = comparable(b[ib]);
    if constexpr (Op == Compare::Equal) y[i] = x == z;
    else if constexpr (Op == Compare::Less) y[i] = x < z;
    else if constexpr (Op == Compare::Greater) y[i] = x > z;
    else if constexpr (Op == Compare::LessOrEqual) y[i] = x <= z;
    else if constexpr (Op == Compare::GreaterOrEqual) y[i] = x >= z;
    else if constexpr (Op == Compare::And) y[i] = bool(x) && bool(z); // (bool operands only)
    else if constexpr (Op == Compare::Or) y[i] = bool(x) || bool(z);
    else y[i] = bool(x) != bool(z);
  }
}

template <typename F> Status dispatchComparable(DType t, F &&f) {
  switch (t) {
  case DType::I64: return f(int64_t{});
  case DType::I32: return f(int32_t{});
  case DType::Bool: return f(bool{});
  default: return dispatchFloatStorage(t, f);
  }
}

template <Compare Op> Status compareOp(const KernelContext &c) {
  const TensorView &a = c.inputs[0], &b = c.inputs[1], &y = c.outputs[0];
  if (a.dtype != b.dtype) return sdError("comparison operands differ in element type");
  int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  StatusOr<Broadcast> bc = broadcastOf(y.dims, {&a.dims, &b.dims});
  if (!bc.isOk()) return bc.status();
  return dispatchComparable(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    compareKernel<Op, T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(*bc, a.as<T>(), b.as<T>(), y.as<bool>(), n);
    return launchStatus("comparison");
  });
}

__global__ void notKernel(const bool *x, bool *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = !x[i];
}

Status NotKernel(const KernelContext &c) {
  int64_t n = c.outputs[0].numElements();
  if (n == 0) return Status::ok();
  notKernel<<<blocksFor(n), kThreads, 0, streamOf(c)>>>(c.inputs[0].as<bool>(), c.outputs[0].as<bool>(), n);
  return launchStatus("Not");
}

// IsNaN: fp16 training's skip test reads it (sd-optimizer: norm - norm is NaN
// exactly when the gradient norm is Inf or NaN).
template <typename T> __global__ void isNaNKernel(const T *x, bool *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    auto v = load(x[i]);
    y[i] = isnan(v);
  }
}

template <typename T> __global__ void isInfKernel(const T *x, bool *y, int64_t n, bool negative, bool positive) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    auto v = load(x[i]);
    y[i] = isinf(v) && (v < 0 ? negative : positive);
  }
}

Status IsInfKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t n = c.outputs[0].numElements();
  if (n == 0) return Status::ok();
  const bool negative = c.attrs.getInt("detect_negative", 1) != 0, positive = c.attrs.getInt("detect_positive", 1) != 0;
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    isInfKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(x.as<T>(), c.outputs[0].as<bool>(), n, negative,
                                                                 positive);
    return launchStatus("IsInf");
  });
}

Status IsNaNKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t n = c.outputs[0].numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    isNaNKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(x.as<T>(), c.outputs[0].as<bool>(), n);
    return launchStatus("IsNaN");
  });
}

// Clip: its bounds are one-element device tensors (absent: no bound), read by
// every thread from device memory rather than on the host, which would
// break graph capture. NaN fails both compares and passes through, as on the CPU.
template <typename T> __global__ void clipKernel(const T *x, const T *lo, const T *hi, T *y, int64_t n) {
  using C = Compute<T>;
  const bool hasLo = lo, hasHi = hi;
  const C l = hasLo ? load(lo[0]) : C(0), h = hasHi ? load(hi[0]) : C(0);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    C v = load(x[i]);
    if (hasLo && v < l) v = l;
    if (hasHi && h < v) v = h;
    y[i] = store<T>(v);
  }
}

Status ClipKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  auto bound = [&](size_t i) -> const void * { return c.hasInput(i) ? c.inputs[i].data : nullptr; };
  for (size_t i = 1; i < 3; ++i)
    if (bound(i) && (c.inputs[i].dtype != x.dtype || c.inputs[i].numElements() != 1))
      return sdError("Clip's bounds must be single values of x's type");
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    clipKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(x.as<T>(), static_cast<const T *>(bound(1)),
                                                               static_cast<const T *>(bound(2)), y.as<T>(), n);
    return launchStatus("Clip");
  };
  if (x.dtype == DType::I64) return launch(int64_t{});
  if (x.dtype == DType::I32) return launch(int32_t{});
  return dispatchFloatStorage(x.dtype, launch);
}

// Cast between the float storage types, the 8- to 64-bit integers and bool,
// with the CPU kernel's rules (kernels/cpu/elementwise.cc): float to integer
// truncates and saturates (NaN gives 0), integer to integer wraps, anything
// to bool is "not zero"; floats convert through double.
template <typename T> constexpr bool kFloatStorage =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __half> ||
    std::is_same_v<T, __nv_bfloat16>;

template <typename I, typename O> __device__ inline O castOne(I x) {
  if constexpr (std::is_same_v<O, bool>) {
    if constexpr (kFloatStorage<I>) return load(x) != Compute<I>(0);
    else return x != I(0);
  } else if constexpr (kFloatStorage<I> && std::is_integral_v<O>) {
    const double v = double(load(x));
    if (v != v) return O(0);
    if (v <= double(::cuda::std::numeric_limits<O>::lowest())) return ::cuda::std::numeric_limits<O>::lowest();
    if (v >= double(::cuda::std::numeric_limits<O>::max())) return ::cuda::std::numeric_limits<O>::max();
    return O(v);
  } else if constexpr (std::is_integral_v<I> && std::is_integral_v<O>) {
    return O(x);
  } else if constexpr (std::is_integral_v<I>) {
    return store<O>(Compute<O>(x));
  } else if constexpr (std::is_same_v<I, double> || std::is_same_v<O, double>) {
    return store<O>(Compute<O>(double(load(x))));
  } else {
    return store<O>(load(x)); // between f32 and the halves: widening to double first changes nothing
  }
}

// V elements per thread as one vector (V = kPack where both pointers are
// aligned for it, else 1).
template <int V, typename I, typename O> __global__ void castKernel(const I *x, O *y, int64_t n) {
  using PI = Pack<I, V>;
  using PO = Pack<O, V>;
  forEachPack<V>(
      n,
      [&](int64_t p) {
        const PI a = reinterpret_cast<const PI *>(x)[p];
        PO b;
#pragma unroll
        for (int k = 0; k < V; ++k) b.v[k] = castOne<I, O>(a.v[k]);
        reinterpret_cast<PO *>(y)[p] = b;
      },
      [&](int64_t i) { y[i] = castOne<I, O>(x[i]); });
}

TypeSet castTypes() {
  return floatStorage() | TypeSet{DType::I64, DType::I32, DType::I16, DType::I8, DType::U64, DType::U32, DType::U16,
                                  DType::U8, DType::Bool};
}

template <typename F> Status dispatchCastType(DType t, F &&f) {
  return dispatchInteger(t, f, [&](DType other) {
    if (other == DType::Bool) return f(bool{});
    return dispatchFloatStorage(other, f);
  });
}

Status CastKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  if (x.dtype == y.dtype) return copyTensor(x, y, streamOf(c), "Cast");
  return dispatchCastType(x.dtype, [&](auto in) {
    return dispatchCastType(y.dtype, [&](auto out) {
      using I = decltype(in);
      using O = decltype(out);
      if (packAligned<I>(x.data) && packAligned<O>(y.data))
        castKernel<kPack, I, O><<<packBlocks<kPack>(n), kThreads, 0, streamOf(c)>>>(x.as<I>(), y.as<O>(), n);
      else
        castKernel<1, I, O><<<packBlocks<1>(n), kThreads, 0, streamOf(c)>>>(x.as<I>(), y.as<O>(), n);
      return launchStatus("Cast");
    });
  });
}

// Dropout at inference: the identity, and an all-true mask where asked for.
Status DropoutKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(copyTensor(c.inputs[0], c.outputs[0], streamOf(c), "Dropout"));
  if (c.outputs.size() > 1 && c.outputs[1].data && c.outputs[1].byteSize())
    return cudaCheck(cudaMemsetAsync(c.outputs[1].data, 1, c.outputs[1].byteSize(), streamOf(c)), "Dropout");
  return Status::ok();
}

// GroupedCast (sd-group-weight-casts): f32 tensors rounded to one half type
// in one launch; each block rounds kCastChunk elements of one tensor.
struct CastSlot {
  const float *x;
  void *y;
  int64_t n;
  int64_t firstBlock;
  bool sameTensors(const CastSlot &o) const { return x == o.x && y == o.y && n == o.n; }
};

constexpr int64_t kCastChunk = int64_t(kThreads) * 4;

template <typename O> __global__ void groupedCastKernel(const CastSlot *slots, int count) {
  const CastSlot t = slots[blockSlot(slots, count)];
  const int64_t begin = (int64_t(blockIdx.x) - t.firstBlock) * kCastChunk, end = std::min(t.n, begin + kCastChunk);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) static_cast<O *>(t.y)[i] = castOne<float, O>(t.x[i]);
}

// The slots of the step's tensors (empty when they are not f32 operands and
// half results of their sizes, one half type).
std::vector<CastSlot> castSlots(const KernelContext &c, int64_t &blocks) {
  std::vector<CastSlot> slots;
  blocks = 0;
  if (c.inputs.size() != c.outputs.size() || c.outputs.empty() || !dtypeIsHalf(c.outputs[0].dtype)) return slots;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const TensorView &x = c.inputs[i], &y = c.outputs[i];
    if (x.dtype != DType::F32 || y.dtype != c.outputs[0].dtype || x.numElements() != y.numElements()) return {};
    slots.push_back({x.as<float>(), y.data, x.numElements(), blocks});
    blocks += (x.numElements() + kCastChunk - 1) / kCastChunk;
  }
  return slots;
}

std::shared_ptr<const void> prepareGroupedCast(const PrepareContext &p) {
  return prepareTable<CastSlot>(p, castSlots);
}

Status GroupedCastKernel(const KernelContext &c) {
  StatusOr<const TensorTable<CastSlot> *> prepared =
      preparedTable<CastSlot>(c, castSlots, "GroupedCast", "its operands are not f32 tensors rounded to one half type");
  if (!prepared.isOk()) return prepared.status();
  const TensorTable<CastSlot> *table = *prepared;
  if (table->blocks == 0) return Status::ok();
  const int count = int(table->slots.size());
  if (c.outputs[0].dtype == DType::BF16)
    groupedCastKernel<__nv_bfloat16><<<unsigned(table->blocks), kThreads, 0, streamOf(c)>>>(table->device, count);
  else
    groupedCastKernel<__half><<<unsigned(table->blocks), kThreads, 0, streamOf(c)>>>(table->device, count);
  return launchStatus("GroupedCast");
}

} // namespace

void registerElementwiseKernels() {
  TypeSet f = floatStorage();
  registerKernel("Relu", ReluKernel, f);
  registerKernel("Sigmoid", SigmoidKernel, f);
  registerKernel("Gelu", GeluKernel, f);
  registerKernel("GeluGrad", GeluGradKernel, f);
  registerKernel("Neg", NegKernel, f);
  registerKernel("Abs", AbsKernel, f);
  registerKernel("Exp", ExpKernel, f);
  registerKernel("Log", LogKernel, f);
  registerKernel("Sqrt", SqrtKernel, f);
  registerKernel("Tanh", TanhKernel, f);
  registerKernel("Reciprocal", ReciprocalKernel, f);
  registerKernel("Erf", ErfKernel, f);
  registerKernel("Softplus", SoftplusKernel, f);
  registerKernel("Sin", SinKernel, f);
  registerKernel("Cos", CosKernel, f);
  registerKernel("Tan", TanKernel, f);
  registerKernel("Asin", AsinKernel, f);
  registerKernel("Acos", AcosKernel, f);
  registerKernel("Atan", AtanKernel, f);
  registerKernel("Sinh", SinhKernel, f);
  registerKernel("Cosh", CoshKernel, f);
  registerKernel("Asinh", AsinhKernel, f);
  registerKernel("Acosh", AcoshKernel, f);
  registerKernel("Atanh", AtanhKernel, f);
  registerKernel("HardSigmoid", HardSigmoidKernel, f);
  registerKernel("HardSwish", HardSwishKernel, f);
  registerKernel("LeakyRelu", LeakyReluKernel, f);
  registerKernel("Elu", EluKernel, f);
  registerKernel("Selu", SeluKernel, f);
  registerKernel("Celu", CeluKernel, f);
  registerKernel("ThresholdedRelu", ThresholdedReluKernel, f);
  registerKernel("Softsign", SoftsignKernel, f);
  registerKernel("Mish", MishKernel, f);
  registerKernel("Swish", SwishKernel, f);
  registerKernel("Floor", FloorKernel, f);
  registerKernel("Ceil", CeilKernel, f);
  registerKernel("Round", RoundKernel, f);
  registerKernel("Sign", SignKernel, f);
  registerKernel("Shrink", ShrinkKernel, f);
  registerKernel("IsInf", IsInfKernel, f);
  registerKernel("PRelu", PReluKernel, f);
  TypeSet arithmetic = f | TypeSet{DType::I64, DType::I32};
  registerKernel("Add", AddKernel, arithmetic);
  registerKernel("Sub", SubKernel, arithmetic);
  registerKernel("Mul", MulKernel, arithmetic);
  registerKernel("Div", DivKernel, arithmetic);
  registerKernel("Pow", PowKernel, f);
  registerKernel("Max", MaxKernel, arithmetic);
  registerKernel("Min", MinKernel, arithmetic);
  registerKernel("Sum", SumKernel, arithmetic);
  registerKernel("Mean", MeanKernel, f);
  registerKernel("Mod", ModKernel, arithmetic);
  registerKernel("Clip", ClipKernel, arithmetic);
  TypeSet comparable = floatStorage() | TypeSet{DType::I64, DType::I32};
  registerKernel("Equal", compareOp<Compare::Equal>, comparable | TypeSet{DType::Bool});
  registerKernel("Less", compareOp<Compare::Less>, comparable);
  registerKernel("Greater", compareOp<Compare::Greater>, comparable);
  registerKernel("LessOrEqual", compareOp<Compare::LessOrEqual>, comparable);
  registerKernel("GreaterOrEqual", compareOp<Compare::GreaterOrEqual>, comparable);
  registerKernel("Not", NotKernel, TypeSet{DType::Bool});
  registerKernel("And", compareOp<Compare::And>, TypeSet{DType::Bool});
  registerKernel("Or", compareOp<Compare::Or>, TypeSet{DType::Bool});
  registerKernel("Xor", compareOp<Compare::Xor>, TypeSet{DType::Bool});
  registerKernel("IsNaN", IsNaNKernel, f);
  registerKernel("Where", WhereKernel, TypeSet::all(), nullptr, 1);
  // A run-time If (shapes/control_shapes.cc) is a Where with a one-element
  // condition; reading the condition on the host would break graph capture.
  registerKernel("IfSelect", WhereKernel, TypeSet::all(), nullptr, 1);
  // Narrow storage types (f8, f4, 4- and 2-bit integers) bind to the CPU's Cast.
  registerKernel("Cast", CastKernel, castTypes(), nullptr, 0, castTypes());
  registerKernel("CastLike", CastKernel, castTypes(), nullptr, 0, castTypes()); // (the type comes from the result)
  registerKernel("Dropout", DropoutKernel, f);
  registerKernel("GroupedCast", GroupedCastKernel, TypeSet{DType::F32}, prepareGroupedCast, 0, TypeSet::halves());
}

} // namespace sd::cuda
