// CPU kernels of the elementwise family: unary math and activations, binary
// broadcast arithmetic, comparisons and logic, variadic reductions, Where,
// Clip, Cast.
#include "cpu_util.h"
#include "half_convert.h"
#include "vecmath.h"
#include "sd/ops/math/activations.h"
#include "sd/ops/math/integer.h"
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <limits>
#include <vector>

namespace sd::cpu {

Dims broadcastStrides(const Dims &in, const Dims &out) {
  Dims s(out.size(), 0);
  Dims inS = stridesOf(in);
  // Shape rules guarantee in.size() <= out.size(); extra leading dims of `in`
  // (all 1 when valid) are skipped rather than indexed out of bounds.
  size_t skip = in.size() > out.size() ? in.size() - out.size() : 0;
  size_t off = out.size() + skip - in.size();
  for (size_t i = skip; i < in.size(); ++i)
    s[off + i - skip] = in[i] == 1 ? 0 : inS[i];
  return s;
}

namespace {

template <typename T, typename F>
Status mapUnary(const KernelContext &c, F f) {
  const T *x = c.inputs[0].as<T>();
  T *y = c.outputs[0].as<T>();
  parallelFor(c.pool, c.inputs[0].numElements(), 1 << 15,
              [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
              });
  return Status::ok();
}

// Unary float op from a functor template taking (value, attrs-derived params).
#define SD_FLOAT_UNARY(NAME, EXPR)                                            \
  Status NAME##Kernel(const KernelContext &c) {                               \
    [[maybe_unused]] double alpha = c.attrs.getFloat("alpha", NAME##Alpha);   \
    [[maybe_unused]] double beta = c.attrs.getFloat("beta", NAME##Beta);      \
    [[maybe_unused]] double gamma = c.attrs.getFloat("gamma", NAME##Gamma);   \
    return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {                   \
      using T = decltype(tag);                                                \
      return mapUnary<T>(c, [=](T x) -> T { return T(EXPR); });              \
    });                                                                       \
  }

#define SD_PARAMS(NAME, A, B, G)                                              \
  constexpr double NAME##Alpha = A, NAME##Beta = B, NAME##Gamma = G;

SD_PARAMS(Exp, 0, 0, 0) SD_FLOAT_UNARY(Exp, std::exp(x))

// f32 paths through the vectorized loops; f64 keeps libm.
template <void (*Vec)(const float *, float *, int64_t)>
Status vectorized(const KernelContext &c, Status (*fallback)(const KernelContext &)) {
  if (c.inputs[0].dtype != DType::F32) return fallback(c);
  const float *x = c.inputs[0].as<float>();
  float *y = c.outputs[0].as<float>();
  parallelFor(c.pool, c.inputs[0].numElements(), 1 << 15, [&](int64_t b, int64_t e) { Vec(x + b, y + b, e - b); });
  return Status::ok();
}
SD_PARAMS(Log, 0, 0, 0) SD_FLOAT_UNARY(Log, std::log(x))
SD_PARAMS(Sqrt, 0, 0, 0) SD_FLOAT_UNARY(Sqrt, std::sqrt(x))
SD_PARAMS(Reciprocal, 0, 0, 0) SD_FLOAT_UNARY(Reciprocal, T(1) / x)
SD_PARAMS(Sin, 0, 0, 0) SD_FLOAT_UNARY(Sin, std::sin(x))
SD_PARAMS(Cos, 0, 0, 0) SD_FLOAT_UNARY(Cos, std::cos(x))
SD_PARAMS(Tan, 0, 0, 0) SD_FLOAT_UNARY(Tan, std::tan(x))
SD_PARAMS(Asin, 0, 0, 0) SD_FLOAT_UNARY(Asin, std::asin(x))
SD_PARAMS(Acos, 0, 0, 0) SD_FLOAT_UNARY(Acos, std::acos(x))
SD_PARAMS(Atan, 0, 0, 0) SD_FLOAT_UNARY(Atan, std::atan(x))
SD_PARAMS(Sinh, 0, 0, 0) SD_FLOAT_UNARY(Sinh, std::sinh(x))
SD_PARAMS(Cosh, 0, 0, 0) SD_FLOAT_UNARY(Cosh, std::cosh(x))
SD_PARAMS(Asinh, 0, 0, 0) SD_FLOAT_UNARY(Asinh, std::asinh(x))
SD_PARAMS(Acosh, 0, 0, 0) SD_FLOAT_UNARY(Acosh, std::acosh(x))
SD_PARAMS(Atanh, 0, 0, 0) SD_FLOAT_UNARY(Atanh, std::atanh(x))
SD_PARAMS(Tanh, 0, 0, 0) SD_FLOAT_UNARY(Tanh, std::tanh(x))
SD_PARAMS(Erf, 0, 0, 0) SD_FLOAT_UNARY(Erf, std::erf(x))
SD_PARAMS(Sigmoid, 0, 0, 0)
SD_FLOAT_UNARY(Sigmoid, math::sigmoid(x))
SD_PARAMS(HardSigmoid, 0.2, 0.5, 0)
SD_FLOAT_UNARY(HardSigmoid, math::hardSigmoid(x, T(alpha), T(beta)))
SD_PARAMS(HardSwish, 0, 0, 0)
SD_FLOAT_UNARY(HardSwish, math::hardSwish(x))
SD_PARAMS(LeakyRelu, 0.01, 0, 0) SD_FLOAT_UNARY(LeakyRelu, math::leakyRelu(x, T(alpha)))
SD_PARAMS(Elu, 1.0, 0, 0) SD_FLOAT_UNARY(Elu, math::elu(x, T(alpha)))
SD_PARAMS(Selu, math::kSeluAlpha, 0, math::kSeluGamma)
SD_FLOAT_UNARY(Selu, math::selu(x, T(alpha), T(gamma)))
SD_PARAMS(Celu, 1.0, 0, 0)
SD_FLOAT_UNARY(Celu, math::celu(x, T(alpha)))
SD_PARAMS(ThresholdedRelu, 1.0, 0, 0) SD_FLOAT_UNARY(ThresholdedRelu, math::thresholdedRelu(x, T(alpha)))
SD_PARAMS(Softplus, 0, 0, 0)
SD_FLOAT_UNARY(Softplus, math::softplus(x))
SD_PARAMS(Softsign, 0, 0, 0) SD_FLOAT_UNARY(Softsign, math::softsign(x))
SD_PARAMS(Mish, 0, 0, 0)
SD_FLOAT_UNARY(Mish, math::mish(x))
SD_PARAMS(Swish, 1.0, 0, 0) SD_FLOAT_UNARY(Swish, math::swish(x, T(alpha)))

// d/dx GELU: exact: Phi(x) + x * phi(x); tanh form: derivative of
// 0.5 x (1 + tanh(k (x + 0.044715 x^3))).
Status GeluGradKernel(const KernelContext &c) {
  bool tanhApprox = c.attrs.getString("approximate", "none") == "tanh";
  if (!tanhApprox && c.inputs[0].dtype == DType::F32) {
    const float *dy = c.inputs[0].as<float>(), *x = c.inputs[1].as<float>();
    float *dx = c.outputs[0].as<float>();
    parallelFor(c.pool, c.outputs[0].numElements(), 8192,
                [&](int64_t b, int64_t e) { vgeluGrad(dy + b, x + b, dx + b, e - b); });
    return Status::ok();
  }
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *dy = c.inputs[0].as<T>(), *x = c.inputs[1].as<T>();
    T *dx = c.outputs[0].as<T>();
    parallelFor(c.pool, c.outputs[0].numElements(), 8192, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        T d = tanhApprox ? math::geluTanhGrad(x[i]) : math::geluErfGrad(x[i]);
        dx[i] = dy[i] * d;
      }
    });
    return Status::ok();
  });
}

Status GeluScalarKernel(const KernelContext &c) {
  bool tanhApprox = c.attrs.getString("approximate", "none") == "tanh";
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if (tanhApprox) return mapUnary<T>(c, [](T x) { return math::geluTanh(x); });
    return mapUnary<T>(c, [](T x) { return math::geluErf(x); });
  });
}

template <typename T> T roundHalfEven(T x) {
  if constexpr (std::is_floating_point_v<T>) return std::nearbyint(x);
  else return x;
}

// Unary ops defined for every numeric type.
template <typename Op> Status numericUnary(const KernelContext &c, Op op) {
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return mapUnary<T>(c, [&](T x) { return op(x); });
  });
}

Status NegKernel(const KernelContext &c) {
  return numericUnary(c, [](auto x) { return decltype(x)(-x); });
}
Status AbsKernel(const KernelContext &c) {
  return numericUnary(c, [](auto x) {
    using T = decltype(x);
    if constexpr (std::is_unsigned_v<T>) return x;
    else return T(x < 0 ? -x : x);
  });
}
Status SignKernel(const KernelContext &c) {
  return numericUnary(c, [](auto x) {
    return math::sign(x);
  });
}
Status ReluKernel(const KernelContext &c) {
  // NaN fails the compare and passes through, as in NumPy and ONNX's reference.
  return numericUnary(c, [](auto x) { return x < decltype(x)(0) ? decltype(x)(0) : x; });
}
Status FloorKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return mapUnary<T>(c, [](T x) { return std::floor(x); });
  });
}
Status CeilKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return mapUnary<T>(c, [](T x) { return std::ceil(x); });
  });
}
Status RoundKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return mapUnary<T>(c, [](T x) { return roundHalfEven(x); });
  });
}

Status copyKernel(const KernelContext &c) {
  if (c.outputs[0].data != c.inputs[0].data)
    std::memcpy(c.outputs[0].data, c.inputs[0].data, c.inputs[0].byteSize());
  return Status::ok();
}

// Dropout at inference: identity, and an all-true mask when requested.
Status DropoutKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(copyKernel(c));
  if (c.outputs.size() > 1 && c.outputs[1].data)
    std::memset(c.outputs[1].data, 1, c.outputs[1].byteSize());
  return Status::ok();
}

Status NotKernel(const KernelContext &c) {
  const uint8_t *x = c.inputs[0].as<uint8_t>();
  uint8_t *y = c.outputs[0].as<uint8_t>();
  for (int64_t i = 0, n = c.inputs[0].numElements(); i < n; ++i) y[i] = !x[i];
  return Status::ok();
}

template <bool IsNan> Status classifyKernel(const KernelContext &c) {
  int64_t detectPos = c.attrs.getInt("detect_positive", 1);
  int64_t detectNeg = c.attrs.getInt("detect_negative", 1);
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *x = c.inputs[0].as<T>();
    uint8_t *y = c.outputs[0].as<uint8_t>();
    for (int64_t i = 0, n = c.inputs[0].numElements(); i < n; ++i) {
      if (IsNan) y[i] = std::isnan(x[i]);
      else y[i] = std::isinf(x[i]) && ((x[i] > 0 && detectPos) || (x[i] < 0 && detectNeg));
    }
    return Status::ok();
  });
}

// Applies out = op(a, b) with broadcasting; TO is the output element type.
template <typename T, typename TO, typename Op>
Status binaryBroadcast(const KernelContext &c, Op op) {
  const TensorView &a = c.inputs[0], &b = c.inputs[1];
  const TensorView &o = c.outputs[0];
  const T *pa = a.as<T>(), *pb = b.as<T>();
  TO *po = o.as<TO>();
  int64_t n = o.numElements();
  if (a.dims == o.dims && b.dims == o.dims) {
    parallelFor(c.pool, n, 1 << 15, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = op(pa[i], pb[i]);
    });
    return Status::ok();
  }
  if (a.dims == o.dims && b.numElements() == 1) {
    T bv = pb[0];
    parallelFor(c.pool, n, 1 << 15, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = op(pa[i], bv);
    });
    return Status::ok();
  }
  Dims strides[2] = {broadcastStrides(a.dims, o.dims), broadcastStrides(b.dims, o.dims)};
  forEachBroadcastRow<2>(c.pool, o.dims, strides,
                         [&](int64_t oOff, const int64_t *in, int64_t cnt, const int64_t *st) {
                           const T *x = pa + in[0], *y = pb + in[1];
                           TO *z = po + oOff;
                           // The common rows (a per-channel scale or bias over an image row,
                           // rows of equal shape) with constant strides, so they vectorize.
                           if (st[0] == 1 && st[1] == 0) {
                             const T yv = *y;
                             for (int64_t i = 0; i < cnt; ++i) z[i] = op(x[i], yv);
                           } else if (st[0] == 0 && st[1] == 1) {
                             const T xv = *x;
                             for (int64_t i = 0; i < cnt; ++i) z[i] = op(xv, y[i]);
                           } else if (st[0] == 1 && st[1] == 1) {
                             for (int64_t i = 0; i < cnt; ++i) z[i] = op(x[i], y[i]);
                           } else {
                             for (int64_t i = 0; i < cnt; ++i) z[i] = op(x[i * st[0]], y[i * st[1]]);
                           }
                         });
  return Status::ok();
}

template <typename Op> Status arithmetic(const KernelContext &c, Op op) {
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return binaryBroadcast<T, T>(c, [&](T x, T y) { return T(op(x, y)); });
  });
}

Status AddKernel(const KernelContext &c) { return arithmetic(c, [](auto x, auto y) { return x + y; }); }
Status SubKernel(const KernelContext &c) { return arithmetic(c, [](auto x, auto y) { return x - y; }); }
Status MulKernel(const KernelContext &c) { return arithmetic(c, [](auto x, auto y) { return x * y; }); }
Status DivKernel(const KernelContext &c) {
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      // Integer division by zero is undefined in ONNX; define it as 0 rather than trap.
      return binaryBroadcast<T, T>(c, [](T x, T y) { return y == 0 ? T(0) : T(x / y); });
    } else {
      return binaryBroadcast<T, T>(c, [](T x, T y) { return x / y; });
    }
  });
}
Status ModKernel(const KernelContext &c) {
  bool fmod = c.attrs.getInt("fmod", 0) != 0;
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return binaryBroadcast<T, T>(c, [fmod](T x, T y) -> T { return math::mod(x, y, fmod); });
  });
}
Status PowKernel(const KernelContext &c) {
  DType bt = c.inputs[0].dtype;
  // x^2 (RMSNorm's variance, every exporter writes it as Pow) as one multiply:
  // the correctly rounded square, without libm's pow per element.
  std::vector<double> e;
  if (c.inputs[1].numElements() == 1 && c.outputs[0].dims == c.inputs[0].dims && readDoubles(c.inputs[1], e) &&
      e[0] == 2.0 && (bt == DType::F32 || bt == DType::F64))
    return dispatchFloat(bt, [&](auto tag) {
      using T = decltype(tag);
      return mapUnary<T>(c, [](T x) { return x * x; });
    });
  // Exponent may have another type than the base; compute in double.
  if (c.inputs[1].dtype != bt) {
    return dispatchNumeric(bt, [&](auto tag) {
      using T = decltype(tag);
      std::vector<double> e;
      if (!readDoubles(c.inputs[1], e)) return sdError("Pow exponent type unsupported");
      std::vector<T> ex(e.size());
      for (size_t i = 0; i < e.size(); ++i) ex[i] = T(e[i]);
      KernelContext c2{c.attrs, c.inputs, c.outputs, c.pool};
      c2.inputs[1].data = ex.data();
      c2.inputs[1].dtype = bt;
      return binaryBroadcast<T, T>(c2, [](T x, T y) { return T(std::pow(double(x), double(y))); });
    });
  }
  return dispatchNumeric(bt, [&](auto tag) {
    using T = decltype(tag);
    return binaryBroadcast<T, T>(c, [](T x, T y) {
      if constexpr (std::is_same_v<T, float>) return std::pow(x, y);
      else return T(std::pow(double(x), double(y)));
    });
  });
}
Status PReluKernel(const KernelContext &c) {
  return arithmetic(c, [](auto x, auto s) { return x < decltype(x)(0) ? x * s : x; });
}
// ONNX BitShift: math::bitShift (sd/ops/math/integer.h).
Status BitShiftKernel(const KernelContext &c) {
  bool left = c.attrs.getString("direction", "LEFT") == "LEFT";
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      return binaryBroadcast<T, T>(c, [left](T x, T y) { return math::bitShift(x, y, left); });
    } else {
      return sdError("BitShift needs integers");
    }
  });
}

// Shrink: x + bias below -lambd, x - bias above lambd, else 0 (any numeric type).
Status ShrinkKernel(const KernelContext &c) {
  double bias = c.attrs.getFloat("bias", 0.0), lambd = c.attrs.getFloat("lambd", 0.5);
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return mapUnary<T>(c, [=](T x) { return T(math::shrink(double(x), lambd, bias)); });
  });
}

// BitwiseAnd/Or/Xor/Not on the integers' bits.
template <typename Op> Status bitwise(const KernelContext &c, Op op) {
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) return binaryBroadcast<T, T>(c, [op](T x, T y) { return T(op(x, y)); });
    else return sdError("bitwise ops need integers");
  });
}
Status BitwiseAndKernel(const KernelContext &c) { return bitwise(c, [](auto x, auto y) { return x & y; }); }
Status BitwiseOrKernel(const KernelContext &c) { return bitwise(c, [](auto x, auto y) { return x | y; }); }
Status BitwiseXorKernel(const KernelContext &c) { return bitwise(c, [](auto x, auto y) { return x ^ y; }); }
Status BitwiseNotKernel(const KernelContext &c) {
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) return mapUnary<T>(c, [](T x) { return T(~x); });
    else return sdError("BitwiseNot needs integers");
  });
}

template <typename Op> Status compare(const KernelContext &c, Op op) {
  DType t = c.inputs[0].dtype;
  if (t == DType::Bool)
    return binaryBroadcast<uint8_t, uint8_t>(c, [&](uint8_t x, uint8_t y) { return uint8_t(op(x, y)); });
  return dispatchNumeric(t, [&](auto tag) {
    using T = decltype(tag);
    return binaryBroadcast<T, uint8_t>(c, [&](T x, T y) { return uint8_t(op(x, y)); });
  });
}
Status EqualKernel(const KernelContext &c) { return compare(c, [](auto x, auto y) { return x == y; }); }
Status LessKernel(const KernelContext &c) { return compare(c, [](auto x, auto y) { return x < y; }); }
Status LessOrEqualKernel(const KernelContext &c) { return compare(c, [](auto x, auto y) { return x <= y; }); }
Status GreaterKernel(const KernelContext &c) { return compare(c, [](auto x, auto y) { return x > y; }); }
Status GreaterOrEqualKernel(const KernelContext &c) { return compare(c, [](auto x, auto y) { return x >= y; }); }
Status AndKernel(const KernelContext &c) {
  return binaryBroadcast<uint8_t, uint8_t>(c, [](uint8_t x, uint8_t y) { return uint8_t(x && y); });
}
Status OrKernel(const KernelContext &c) {
  return binaryBroadcast<uint8_t, uint8_t>(c, [](uint8_t x, uint8_t y) { return uint8_t(x || y); });
}
Status XorKernel(const KernelContext &c) {
  return binaryBroadcast<uint8_t, uint8_t>(c, [](uint8_t x, uint8_t y) { return uint8_t(!x != !y); });
}

// Variadic Min/Max/Sum/Mean: fold pairwise into the output. The output may
// share its buffer with any operand (sd-inplace-reuse); that operand is folded
// first, before the output is written, which the ops' commutativity allows.
template <typename Op> Status variadic(const KernelContext &c, Op op, bool mean) {
  return dispatchNumeric(c.outputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    const TensorView &o = c.outputs[0];
    T *po = o.as<T>();
    int64_t n = o.numElements();
    bool first = true;
    std::vector<const TensorView *> order;
    for (const TensorView &in : c.inputs)
      if (in.data) order.insert(in.data == o.data ? order.begin() : order.end(), &in);
    for (const TensorView *inp : order) {
      const TensorView &in = *inp;
      Dims st = broadcastStrides(in.dims, o.dims);
      Dims idx(o.dims.size(), 0);
      const T *pi = in.as<T>();
      for (int64_t i = 0; i < n; ++i) {
        int64_t off = 0;
        for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
        po[i] = first ? pi[off] : T(op(po[i], pi[off]));
        for (int64_t d = int64_t(idx.size()) - 1; d >= 0; --d) {
          if (++idx[size_t(d)] < o.dims[size_t(d)]) break;
          idx[size_t(d)] = 0;
        }
      }
      first = false;
    }
    if (mean) {
      T k = T(c.inputs.size());
      for (int64_t i = 0; i < n; ++i) po[i] = T(po[i] / k);
    }
    return Status::ok();
  });
}
Status MinKernel(const KernelContext &c) {
  return variadic(c, [](auto x, auto y) {
    if constexpr (std::is_floating_point_v<decltype(x)>)
      if (std::isnan(x) || std::isnan(y)) return x + y;
    return x < y ? x : y;
  }, false);
}
Status MaxKernel(const KernelContext &c) {
  return variadic(c, [](auto x, auto y) {
    if constexpr (std::is_floating_point_v<decltype(x)>)
      if (std::isnan(x) || std::isnan(y)) return x + y;
    return x > y ? x : y;
  }, false);
}
Status SumKernel(const KernelContext &c) { return variadic(c, [](auto x, auto y) { return x + y; }, false); }
Status MeanKernel(const KernelContext &c) { return variadic(c, [](auto x, auto y) { return x + y; }, true); }

Status WhereKernel(const KernelContext &c) {
  return dispatchBytes(c.outputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    const TensorView &o = c.outputs[0];
    Dims st[3] = {broadcastStrides(c.inputs[0].dims, o.dims),
                  broadcastStrides(c.inputs[1].dims, o.dims),
                  broadcastStrides(c.inputs[2].dims, o.dims)};
    const uint8_t *cond = c.inputs[0].as<uint8_t>();
    const T *x = c.inputs[1].as<T>(), *y = c.inputs[2].as<T>();
    T *z = o.as<T>();
    forEachBroadcastRow<3>(c.pool, o.dims, st,
                           [&](int64_t oo, const int64_t *in, int64_t cnt, const int64_t *s) {
                             for (int64_t i = 0; i < cnt; ++i)
                               z[oo + i] = cond[in[0] + i * s[0]] ? x[in[1] + i * s[1]] : y[in[2] + i * s[2]];
                           });
    return Status::ok();
  });
}

Status ClipKernel(const KernelContext &c) {
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
    if (c.hasInput(1) && c.inputs[1].data) lo = c.inputs[1].as<T>()[0];
    if (c.hasInput(2) && c.inputs[2].data) hi = c.inputs[2].as<T>()[0];
    // NaN fails both comparisons and passes through; max/min in this order
    // keeps that and vectorizes (an explicit isnan branch ran 10x slower).
    return mapUnary<T>(c, [=](T x) { return std::min(std::max(x, lo), hi); });
  });
}

// Converts element i of `in` to double/int64, then to the output type.
template <typename TI, typename TO> void convert(const void *in, void *out, int64_t n) {
  const TI *x = static_cast<const TI *>(in);
  TO *y = static_cast<TO *>(out);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<TO, uint8_t> && std::is_same_v<TI, bool>) y[i] = x[i];
    else if constexpr (std::is_floating_point_v<TI> && std::is_integral_v<TO>) {
      // Out-of-range float→int is UB in C++; saturate like most hardware.
      double v = double(x[i]);
      if (std::isnan(v)) y[i] = 0;
      else if (v <= double(std::numeric_limits<TO>::lowest())) y[i] = std::numeric_limits<TO>::lowest();
      else if (v >= double(std::numeric_limits<TO>::max())) y[i] = std::numeric_limits<TO>::max();
      else y[i] = TO(v);
    } else y[i] = TO(x[i]);
  }
}

Status castBetween(const TensorView &in, const TensorView &out, bool saturate = true,
                   PowerOfTwoRounding e8m0 = PowerOfTwoRounding::Up);

// Narrow floats go through f32, 4- and 2-bit integers (one extended byte each)
// through i8/u8 on the way in and i64, wrapped, on the way out.
Status castNarrow(const TensorView &in, const TensorView &out, bool saturate, PowerOfTwoRounding e8m0) {
  int64_t n = in.numElements();
  DType from = in.dtype, to = out.dtype;
  if (dtypeIsNarrowFloat(from)) {
    std::vector<float> tmp(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tmp[size_t(i)] = float8ToFloat(in.as<uint8_t>()[i], from);
    return castBetween(TensorView{tmp.data(), DType::F32, in.dims}, out, saturate);
  }
  if (dtypeIsNarrow(from)) {
    bool isSigned = from == DType::I4 || from == DType::I2;
    return castBetween(TensorView{in.data, isSigned ? DType::I8 : DType::U8, in.dims}, out, saturate);
  }
  if (dtypeIsNarrowFloat(to)) {
    std::vector<float> tmp(static_cast<size_t>(n));
    SD_RETURN_IF_ERROR(castBetween(in, TensorView{tmp.data(), DType::F32, in.dims}, saturate));
    for (int64_t i = 0; i < n; ++i) out.as<uint8_t>()[i] = floatToFloat8(tmp[size_t(i)], to, saturate, e8m0);
    return Status::ok();
  }
  std::vector<int64_t> tmp(static_cast<size_t>(n));
  SD_RETURN_IF_ERROR(castBetween(in, TensorView{tmp.data(), DType::I64, in.dims}, saturate));
  for (int64_t i = 0; i < n; ++i) out.as<int8_t>()[i] = int8_t(wrapNarrowInteger(tmp[size_t(i)], to));
  return Status::ok();
}

Status castBetween(const TensorView &in, const TensorView &out, bool saturate, PowerOfTwoRounding e8m0) {
  int64_t n = in.numElements();
  DType from = in.dtype, to = out.dtype;
  if (from == to) {
    std::memcpy(out.data, in.data, in.byteSize());
    return Status::ok();
  }
  if (dtypeIsNarrow(from) || dtypeIsNarrow(to)) return castNarrow(in, out, saturate, e8m0);
  // Half types go through f32: straight into (or out of) an f32 side, else
  // through a temporary.
  if (dtypeIsHalf(from)) {
    std::vector<float> tmp(to == DType::F32 ? 0 : static_cast<size_t>(n));
    float *wide = to == DType::F32 ? out.as<float>() : tmp.data();
    widenHalf(from, in.as<uint16_t>(), wide, n);
    return to == DType::F32 ? Status::ok() : castBetween(TensorView{wide, DType::F32, in.dims}, out);
  }
  if (dtypeIsHalf(to)) {
    std::vector<float> tmp(from == DType::F32 ? 0 : static_cast<size_t>(n));
    const float *wide = from == DType::F32 ? in.as<float>() : tmp.data();
    if (from != DType::F32) SD_RETURN_IF_ERROR(castBetween(in, TensorView{tmp.data(), DType::F32, in.dims}));
    narrowHalf(to, wide, out.as<uint16_t>(), n);
    return Status::ok();
  }
  if (to == DType::Bool) {
    return dispatchNumeric(from, [&](auto tag) {
      using T = decltype(tag);
      for (int64_t i = 0; i < n; ++i) out.as<uint8_t>()[i] = in.as<T>()[i] != T(0);
      return Status::ok();
    });
  }
  DType src = from == DType::Bool ? DType::U8 : from;
  return dispatchNumeric(src, [&](auto ti) {
    using TI = decltype(ti);
    return dispatchNumeric(to, [&](auto to_) {
      using TO = decltype(to_);
      convert<TI, TO>(in.data, out.data, n);
      return Status::ok();
    });
  });
}

Status CastKernel(const KernelContext &c) {
  const TensorView &in = c.inputs[0], &out = c.outputs[0];
  // Mixed precision's casts (sd-autocast) are between f32 and a half type:
  // those split across the pool.
  if ((dtypeIsHalf(in.dtype) && out.dtype == DType::F32) || (in.dtype == DType::F32 && dtypeIsHalf(out.dtype)))
    return convertHalf(c.pool, in, out);
  std::string mode = c.attrs.getString("round_mode", "up"); // E8M0 targets only (opset 25)
  PowerOfTwoRounding e8m0 = mode == "down" ? PowerOfTwoRounding::Down
                            : mode == "nearest" ? PowerOfTwoRounding::Nearest : PowerOfTwoRounding::Up;
  return castBetween(c.inputs[0], c.outputs[0], c.attrs.getInt("saturate", 1) != 0, e8m0);
}

// GroupedCast: each f32 input rounded to the half type `to` (sd-group-weight-casts).
Status GroupedCastKernel(const KernelContext &c) {
  SD_CHECK_ARG(c.inputs.size() == c.outputs.size(), "GroupedCast: ", c.inputs.size(), " operands for ",
               c.outputs.size(), " results");
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const TensorView &in = c.inputs[i], &out = c.outputs[i];
    SD_CHECK_ARG(in.dtype == DType::F32 && dtypeIsHalf(out.dtype) && in.numElements() == out.numElements(),
                 "GroupedCast: operand ", i, " (", dtypeName(in.dtype), ", ", in.numElements(),
                 " elements) is not an f32 tensor of its result's size rounded to a half type");
    SD_RETURN_IF_ERROR(convertHalf(c.pool, in, out));
  }
  return Status::ok();
}

} // namespace

Status castTensor(const TensorView &in, const TensorView &out) { return castBetween(in, out); }

void registerElementwiseKernels() {
#define R(N, TYPES) registerCpuKernel(#N, N##Kernel, TYPES);
  const TypeSet floats = TypeSet::floats(), numeric = TypeSet::numeric();
  registerCpuKernel("Exp", [](const KernelContext &c) { return vectorized<vexp>(c, ExpKernel); }, floats);
  registerCpuKernel("Erf", [](const KernelContext &c) { return vectorized<verf>(c, ErfKernel); }, floats);
  registerCpuKernel("Sigmoid", [](const KernelContext &c) { return vectorized<vsigmoid>(c, SigmoidKernel); }, floats);
  registerCpuKernel("Tanh", [](const KernelContext &c) { return vectorized<vtanh>(c, TanhKernel); }, floats);
  registerCpuKernel("Gelu", [](const KernelContext &c) {
    if (c.attrs.getString("approximate", "none") == "tanh") return vectorized<vgeluTanh>(c, GeluScalarKernel);
    return vectorized<vgelu>(c, GeluScalarKernel);
  }, floats);
  registerCpuKernel("GeluGrad", GeluGradKernel, floats);
  R(Log, floats) R(Sqrt, floats) R(Reciprocal, floats) R(Sin, floats) R(Cos, floats) R(Tan, floats)
  R(Asin, floats) R(Acos, floats) R(Atan, floats) R(Sinh, floats) R(Cosh, floats) R(Asinh, floats)
  R(Acosh, floats) R(Atanh, floats) R(HardSigmoid, floats) R(HardSwish, floats)
  R(LeakyRelu, floats) R(Elu, floats) R(Selu, floats) R(Celu, floats) R(ThresholdedRelu, floats)
  R(Softplus, floats) R(Softsign, floats) R(Mish, floats) R(Swish, floats) R(Floor, floats) R(Ceil, floats) R(Round, floats)
  R(Dropout, floats)
  R(Neg, numeric) R(Abs, numeric) R(Sign, numeric) R(Relu, numeric) R(Add, numeric) R(Sub, numeric)
  R(Mul, numeric) R(Div, numeric) R(Mod, numeric) R(Pow, numeric) R(PRelu, numeric) R(Less, numeric)
  R(LessOrEqual, numeric) R(Greater, numeric) R(GreaterOrEqual, numeric) R(Min, numeric) R(Max, numeric)
  R(Sum, numeric) R(Clip, numeric)
  R(Mean, floats) // ONNX defines Mean for floating types only
  R(Equal, numeric | TypeSet{DType::Bool})
  R(Not, TypeSet{DType::Bool}) R(And, TypeSet{DType::Bool}) R(Or, TypeSet{DType::Bool}) R(Xor, TypeSet{DType::Bool})
  R(BitShift, TypeSet::integers()) R(BitwiseAnd, TypeSet::integers()) R(BitwiseOr, TypeSet::integers())
  R(BitwiseXor, TypeSet::integers()) R(BitwiseNot, TypeSet::integers()) R(Shrink, numeric)
  R(Cast, TypeSet::all() | TypeSet::narrow())
  // Where's element type is its second operand's; the first is the bool condition.
  registerCpuKernel("Where", WhereKernel, TypeSet::all(), nullptr, 1);
#undef R
  registerCpuKernel("Identity", copyKernel, TypeSet::all());
  registerCpuKernel("BitCast", copyKernel, TypeSet::all()); // the bytes unchanged; the shape rule checks the widths
  registerCpuKernel("CastLike", CastKernel, TypeSet::all() | TypeSet::narrow());
  registerCpuKernel("GroupedCast", GroupedCastKernel, TypeSet{DType::F32});
  registerCpuKernel("IsNaN", classifyKernel<true>, floats);
  registerCpuKernel("IsInf", classifyKernel<false>, floats);
}

} // namespace sd::cpu
