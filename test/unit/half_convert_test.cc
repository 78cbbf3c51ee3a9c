// The vectorized f16/bf16 conversions of the CPU kernels against the scalar
// ones of sd/format/dtype.h, bit for bit: every 16-bit value widened, and
// floats across every exponent (zeros, subnormals, ties, the overflow edge,
// infinities and NaNs) narrowed.
#include "half_convert.h"
#include "sd/format/dtype.h"
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> probeFloats() {
  std::vector<float> v;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) { // a prime stride reaches every exponent and mantissa pattern
    float f;
    uint32_t b = uint32_t(u);
    std::memcpy(&f, &b, 4);
    v.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 6.103515625e-05f, 5.9604644775390625e-08f,
                  2.98023223876953125e-08f, 2.9802326e-08f, 1e-45f, INFINITY, -INFINITY, NAN, -NAN})
    v.push_back(f);
  for (uint32_t m = 0; m < (1u << 14); ++m) { // every rounding remainder near f16's subnormal and normal steps
    for (uint32_t e : {100u, 102u, 103u, 112u, 113u, 120u, 142u}) {
      float f;
      uint32_t b = (e << 23) | (m << 9) | (m & 0x1ffu);
      std::memcpy(&f, &b, 4);
      v.push_back(f), v.push_back(-f);
    }
  }
  return v;
}

TEST(HalfConvert, EveryHalfWidensAsTheScalarConversion) {
  std::vector<uint16_t> all(1 << 16);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = uint16_t(i);
  std::vector<float> f16(all.size()), bf16(all.size());
  sd::cpu::widenF16(all.data(), f16.data(), int64_t(all.size()));
  sd::cpu::widenBf16(all.data(), bf16.data(), int64_t(all.size()));
  for (uint32_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(bitsOf(f16[i]), bitsOf(sd::halfToFloat(uint16_t(i)))) << std::hex << "f16 0x" << i;
    ASSERT_EQ(bitsOf(bf16[i]), bitsOf(sd::bf16ToFloat(uint16_t(i)))) << std::hex << "bf16 0x" << i;
  }
}

TEST(HalfConvert, FloatsNarrowAsTheScalarConversion) {
  std::vector<float> v = probeFloats();
  std::vector<uint16_t> f16(v.size()), bf16(v.size());
  sd::cpu::narrowF16(v.data(), f16.data(), int64_t(v.size()));
  sd::cpu::narrowBf16(v.data(), bf16.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(f16[i], sd::floatToHalf(v[i])) << std::hex << "f16 of float bits 0x" << bitsOf(v[i]);
    ASSERT_EQ(bf16[i], sd::floatToBf16(v[i])) << std::hex << "bf16 of float bits 0x" << bitsOf(v[i]);
  }
}

} // namespace
