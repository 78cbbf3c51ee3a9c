// ONNX's older normalizations in f64, written once for the CPU and CUDA
// kernels: LpNormalization of one line, LRN at one element, and
// MeanVarianceNormalization of one group. `x(j)` reads element j as a double
// and `y(j, v)` writes it, so each backend brings its own layout and types.
#pragma once
#include "sd/ops/math/host_device.h"
#include <cmath>
#include <cstdint>

namespace sd::math {

// x / ||x||_p along a line of n (p is 1 or 2); a zero line stays zero.
template <typename Load, typename Store> SD_HD void lpNormalizeLine(int64_t n, int64_t p, const Load &x, const Store &y) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double v = x(j);
    s += p == 1 ? std::fabs(v) : v * v;
  }
  if (p == 2) s = std::sqrt(s);
  for (int64_t j = 0; j < n; ++j) y(j, s == 0 ? 0.0 : x(j) / s);
}

// LRN at channel k of `channels`: x / (bias + alpha / size * the sum of
// squares over channels [k - floor((size-1)/2), k + ceil((size-1)/2)]) ^ beta;
// channel(q) reads channel q at the same batch item and position.
template <typename Load>
SD_HD double lrnAt(int64_t k, int64_t channels, int64_t size, double alpha, double beta, double bias,
                   const Load &channel) {
  const int64_t before = (size - 1) / 2, after = size - 1 - before;
  const int64_t first = k - before > 0 ? k - before : 0, last = k + after < channels - 1 ? k + after : channels - 1;
  double sq = 0;
  for (int64_t q = first; q <= last; ++q) {
    const double v = channel(q);
    sq += v * v;
  }
  return channel(k) / std::pow(bias + alpha / double(size) * sq, beta);
}

// (x - mean) / (std + 1e-9) over a group of n values, the variance the
// population's (ONNX's MeanVarianceNormalization).
template <typename Load, typename Store> SD_HD void meanVarianceNormalize(int64_t n, const Load &x, const Store &y) {
  double mean = 0, var = 0;
  for (int64_t j = 0; j < n; ++j) mean += x(j);
  mean /= double(n);
  for (int64_t j = 0; j < n; ++j) var += (x(j) - mean) * (x(j) - mean);
  var /= double(n);
  const double inv = 1.0 / (std::sqrt(var) + 1e-9);
  for (int64_t j = 0; j < n; ++j) y(j, (x(j) - mean) * inv);
}

} // namespace sd::math
