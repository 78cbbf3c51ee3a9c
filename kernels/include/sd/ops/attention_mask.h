// When an Attention step's bool mask is the causal one, shared by the CPU
// kernel (which then skips the masked blocks) and the CUDA kernel (which then
// hands cuDNN its causal band instead of the mask).
#pragma once
#include <cstdint>

namespace sd {

// A mask fill at or below this turns into probability exactly 0 under
// softmax, so skipping the masked keys changes nothing.
constexpr float kFillThatZeroes = -1e4f;

// True when `mask` (rows T, columns S, at these strides) hides exactly the
// keys after each query: key j hidden from query i iff j > i.
inline bool hidesLaterKeys(const bool *mask, int64_t rowStride, int64_t colStride, int64_t T, int64_t S) {
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < S; ++j)
      if (mask[i * rowStride + j * colStride] != (j > i)) return false;
  return true;
}

} // namespace sd
