// Activation functions and their derivatives, shared by the CPU and CUDA
// kernels (std:: math resolves to CUDA's device overloads under nvcc).
#pragma once
#include "sd/ops/math/host_device.h"
#include <cmath>

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

} // namespace sd::math
