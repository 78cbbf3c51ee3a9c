// Activation functions and their derivatives, shared by the CPU and CUDA
// kernels (std:: math resolves to CUDA's device overloads under nvcc).
#pragma once
#include "sd/ops/math/host_device.h"
#include <algorithm>
#include <cmath>
#include <type_traits>

namespace sd::math {

// The branch keeps exp's argument non-positive, so neither side overflows.
template <typename T> SD_HD T sigmoid(T x) {
  return x >= T(0) ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x));
}

template <typename T> SD_HD T relu(T x) { return x > T(0) ? x : (x == x ? T(0) : x); } // NaN stays NaN

constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluTanhCubic = 0.044715;

// GELU, exact: x * Phi(x).
template <typename T> SD_HD T geluErf(T x) { return T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2))); }

// GELU, tanh form: 0.5 x (1 + tanh(k (x + 0.044715 x^3))).
template <typename T> SD_HD T geluTanh(T x) {
  return T(0.5) * x * (T(1) + std::tanh(T(kSqrt2OverPi) * (x + T(kGeluTanhCubic) * x * x * x)));
}

// d/dx of geluErf: Phi(x) + x phi(x).
template <typename T> SD_HD T geluErfGrad(T x) {
  return T(0.5) * (T(1) + std::erf(x * T(kInvSqrt2))) + x * T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
}

// d/dx of geluTanh.
template <typename T> SD_HD T geluTanhGrad(T x) {
  const T k = T(kSqrt2OverPi), a = T(kGeluTanhCubic);
  T t = std::tanh(k * (x + a * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * a * x * x);
}

// log(1 + e^x) without overflow for large x.
template <typename T> SD_HD T softplus(T x) {
  return x > T(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

// ONNX's parameterized activations (alpha, beta, gamma as the ops' attributes,
// already converted to T). std::min/max are kept where ONNX's reference uses
// them, for their NaN behaviour: (b < a ? b : a) passes a NaN in `a` through.
template <typename T> SD_HD T hardSigmoid(T x, T alpha, T beta) {
  return std::max(std::min(alpha * x + beta, T(1)), T(0));
}
template <typename T> SD_HD T hardSwish(T x) { return x * std::max(T(0), std::min(T(1), x / T(6) + T(0.5))); }
template <typename T> SD_HD T leakyRelu(T x, T alpha) { return x >= T(0) ? x : alpha * x; }
template <typename T> SD_HD T elu(T x, T alpha) { return x >= T(0) ? x : alpha * (std::exp(x) - T(1)); }
template <typename T> SD_HD T selu(T x, T alpha, T gamma) {
  return x > T(0) ? gamma * x : gamma * (alpha * std::exp(x) - alpha);
}
template <typename T> SD_HD T celu(T x, T alpha) {
  return std::max(x, T(0)) + std::min(T(0), alpha * (std::exp(x / alpha) - T(1)));
}
template <typename T> SD_HD T thresholdedRelu(T x, T alpha) { return x > alpha ? x : T(0); }
template <typename T> SD_HD T softsign(T x) { return x / (T(1) + std::fabs(x)); }
template <typename T> SD_HD T mish(T x) { return x * std::tanh(softplus(x)); }
template <typename T> SD_HD T swish(T x, T alpha) { return x * sigmoid(alpha * x); }
// 0 and NaN map to themselves.
template <typename T> SD_HD T sign(T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); }
// Shrink: x + bias below -lambd, x - bias above lambd, else 0.
template <typename T> SD_HD T shrink(T x, T lambd, T bias) { return x < -lambd ? x + bias : x > lambd ? x - bias : T(0); }
// ONNX Mod: C's fmod / %, or (fmod false) the remainder with the divisor's
// sign. An integer divisor of 0 (undefined in ONNX) gives 0 rather than a trap.
template <typename T> SD_HD T mod(T x, T y, bool fmod) {
  if constexpr (std::is_floating_point_v<T>) {
    T r = std::fmod(x, y);
    if (!fmod && r != T(0) && ((r < T(0)) != (y < T(0)))) r += y;
    return r;
  } else {
    if (y == T(0)) return T(0);
    T r = T(x % y);
    if constexpr (std::is_signed_v<T>)
      if (!fmod && r != T(0) && ((r < T(0)) != (y < T(0)))) r = T(r + y);
    return r;
  }
}

// Selu's attribute defaults (ONNX's).
constexpr double kSeluAlpha = 1.67326319217681884765625, kSeluGamma = 1.05070102214813232421875;

} // namespace sd::math
