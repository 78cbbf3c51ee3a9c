// Det's LU factorization with partial pivoting, in double, shared by the CPU
// and CUDA kernels: the first largest pivot of each column (ties keep the
// upper row), rows swapped in place, the determinant the pivots' product
// with the swaps' sign.
#pragma once
#include "sd/ops/math/host_device.h"
#include <cstdint>

namespace sd::math {

// The determinant of the m x m row-major matrix in `a`, which it overwrites.
SD_HD double luDeterminant(double *a, int64_t m) {
  double det = 1;
  for (int64_t col = 0; col < m; ++col) {
    int64_t pivot = col;
    for (int64_t r = col + 1; r < m; ++r) {
      const double cand = a[r * m + col], best = a[pivot * m + col];
      if ((cand < 0 ? -cand : cand) > (best < 0 ? -best : best)) pivot = r;
    }
    if (a[pivot * m + col] == 0) return 0;
    if (pivot != col) {
      for (int64_t j = 0; j < m; ++j) {
        const double t = a[pivot * m + j];
        a[pivot * m + j] = a[col * m + j];
        a[col * m + j] = t;
      }
      det = -det;
    }
    const double d = a[col * m + col];
    det *= d;
    if (det == 0) return det;
    for (int64_t r = col + 1; r < m; ++r) {
      const double f = a[r * m + col] / d;
      for (int64_t j = col; j < m; ++j) a[r * m + j] -= f * a[col * m + j];
    }
  }
  return det;
}

} // namespace sd::math
