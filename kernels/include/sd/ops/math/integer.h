// Integer bit operations shared by the CPU and CUDA kernels.
#pragma once
#include "sd/ops/math/host_device.h"
#include <cstdint>
#include <type_traits>

namespace sd::math {

// ONNX BitShift (opset 28 adds signed types): a right shift of a signed value
// is arithmetic; a left shift drops the bits past the sign bit; a shift that
// is negative or at least the width gives what sign extension alone gives
// (-1 for a negative value shifted right, else 0).
template <typename T> SD_HD T bitShift(T x, T y, bool left) {
  using U = std::make_unsigned_t<T>;
  constexpr int64_t bits = int64_t(sizeof(T) * 8);
  bool negative = false;
  if constexpr (std::is_signed_v<T>) negative = x < T(0);
  if (int64_t(y) < 0 || int64_t(y) >= bits) // a u64 shift past 2^63 reads as negative: out of range too
    return T(!left && negative ? T(-1) : T(0));
  if (left) return T(U(x) << unsigned(y));
  return T(negative ? T(~(U(~U(x)) >> unsigned(y))) : T(U(x) >> unsigned(y)));
}

} // namespace sd::math
