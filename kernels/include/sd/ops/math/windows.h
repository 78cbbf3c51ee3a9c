// ONNX's window generators' values, shared by the CPU and CUDA kernels.
#pragma once
#include "sd/ops/math/host_device.h"
#include <cmath>
#include <cstdint>

namespace sd::math {

enum class Window { Hann, Hamming, Blackman };

// Point i of a window over N = size (periodic) or size - 1 (symmetric).
SD_HD double windowValue(Window kind, int64_t i, double N) {
  const double a = 2.0 * 3.14159265358979323846 * double(i) / N;
  if (kind == Window::Hann) return 0.5 - 0.5 * std::cos(a);
  if (kind == Window::Hamming) return 25.0 / 46.0 - 21.0 / 46.0 * std::cos(a);
  return 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2.0 * a);
}

} // namespace sd::math
