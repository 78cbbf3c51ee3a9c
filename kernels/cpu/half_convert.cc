// Branch-free per element (selects, not jumps), so each loop vectorizes; the
// unit test checks every f16 and bf16 value, and floats across every
// exponent, against the scalar conversions.
#include "half_convert.h"
#include "simd_clones.h"
#include <cstring>

namespace sd::cpu {
namespace {

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float f16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (uint32_t(h) >> 10) & 0x1fu, man = h & 0x3ffu;
  // Subnormal (and zero): man * 2^-24, exact, from an integer conversion (no
  // float denormal in sight, so flush-to-zero modes cannot change it).
  const uint32_t sub = bitsOf(float(int32_t(man)) * 5.9604644775390625e-8f);
  const uint32_t normal = ((exp + 112u) << 23) | (man << 13);
  const uint32_t special = 0x7f800000u | (man << 13); // inf, NaN with its payload
  const uint32_t u = exp == 0 ? sub : exp == 31 ? special : normal;
  return floatOf(u | sign);
}

inline uint16_t f32ToF16(float f) {
  const uint32_t u = bitsOf(f), sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
  // Normal (|f| >= 2^-14): rebias the exponent, round to nearest even on the
  // 13 dropped bits; a carry runs into the exponent, up to infinity.
  uint32_t normal = abs - (112u << 23);
  normal = (normal + 0xfffu + ((normal >> 13) & 1u)) >> 13;
  // Subnormal: adding 0.5 leaves float's last place at 2^-24, f16's
  // subnormal step, so the FPU's own rounding (nearest even) does the work.
  const uint32_t sub = bitsOf(floatOf(abs) + 0.5f) - 0x3f000000u;
  uint32_t h = abs >= (143u << 23) ? 0x7c00u : abs < (113u << 23) ? sub : normal; // 2^16 and up: infinity
  h = abs > 0x7f800000u ? 0x7e00u : h;
  return uint16_t(h | sign);
}

inline uint16_t f32ToBf16(float f) {
  const uint32_t u = bitsOf(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

} // namespace

SD_CLONES void widenF16(const uint16_t *in, float *out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = f16ToF32(in[i]);
}

SD_CLONES void narrowF16(const float *in, uint16_t *out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = f32ToF16(in[i]);
}

SD_CLONES void widenBf16(const uint16_t *in, float *out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = floatOf(uint32_t(in[i]) << 16);
}

SD_CLONES void narrowBf16(const float *in, uint16_t *out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = f32ToBf16(in[i]);
}

} // namespace sd::cpu
