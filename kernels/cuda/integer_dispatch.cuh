// Dispatch on the 8- to 64-bit integer types, for CUDA kernels that take
// every integer (bit operations, Range, Cast).
#pragma once
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include <cstdint>

namespace sd::cuda {

// Calls f with the C++ type of `t`, or returns `otherwise(t)` for a type that is not an integer.
template <typename F, typename Otherwise> Status dispatchInteger(DType t, F &&f, Otherwise &&otherwise) {
  switch (t) {
  case DType::I64: return f(int64_t{});
  case DType::I32: return f(int32_t{});
  case DType::I16: return f(int16_t{});
  case DType::I8: return f(int8_t{});
  case DType::U64: return f(uint64_t{});
  case DType::U32: return f(uint32_t{});
  case DType::U16: return f(uint16_t{});
  case DType::U8: return f(uint8_t{});
  default: return otherwise(t);
  }
}

} // namespace sd::cuda
