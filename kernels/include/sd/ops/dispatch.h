// Dispatch on an element type's width, for kernels that only move bytes
// (copies, gathers, transposes, Where); the CPU and CUDA backends share it.
#pragma once
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include <cstdint>

namespace sd {

// Calls fn(U{}) with U the unsigned integer type as wide as one element of `t`.
template <typename F> Status dispatchByWidth(DType t, F &&fn) {
  switch (dtypeSize(t)) {
  case 1: return fn(uint8_t{});
  case 2: return fn(uint16_t{});
  case 4: return fn(uint32_t{});
  case 8: return fn(uint64_t{});
  default: return sdError("no kernel moves elements of type ", dtypeName(t));
  }
}

} // namespace sd
