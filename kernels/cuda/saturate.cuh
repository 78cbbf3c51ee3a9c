// Rounding to an integer type as the CPU's quantizers do (kernels/cpu/quantized.cc):
// half to even, then saturated to the type's range. Shared by quantized.cu and
// integer_products.cu.
#pragma once
#include <cuda/std/limits>

namespace sd::cuda {

template <typename Q> __device__ inline Q saturate(double v) {
  v = nearbyint(v);
  const double lo = double(::cuda::std::numeric_limits<Q>::lowest()), hi = double(::cuda::std::numeric_limits<Q>::max());
  return Q(v < lo ? lo : (v > hi ? hi : v));
}

} // namespace sd::cuda
