// f16 and bf16 to and from f32 over whole arrays, written so GCC vectorizes
// them (cloned per ISA). Bit for bit the scalar conversions of sd/format/
// dtype.h: round to nearest even, subnormals kept, a NaN stays a NaN (f16
// narrowing gives the quiet NaN 0x7e00 with the sign; bf16 keeps the payload).
#pragma once
#include "sd/format/dtype.h"
#include <cstdint>

namespace sd::cpu {
void widenF16(const uint16_t *in, float *out, int64_t n);
void narrowF16(const float *in, uint16_t *out, int64_t n);
void widenBf16(const uint16_t *in, float *out, int64_t n);
void narrowBf16(const float *in, uint16_t *out, int64_t n);
// The same for a half type `t` (f16 or bf16) known at run time.
inline void widenHalf(DType t, const uint16_t *in, float *out, int64_t n) {
  (t == DType::F16 ? widenF16 : widenBf16)(in, out, n);
}
inline void narrowHalf(DType t, const float *in, uint16_t *out, int64_t n) {
  (t == DType::F16 ? narrowF16 : narrowBf16)(in, out, n);
}
} // namespace sd::cpu
