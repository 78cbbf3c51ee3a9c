// DType helpers: sizes, names, IEEE half and bfloat16 conversion.
#include "sd/format/dtype.h"
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace sd {
size_t dtypeSize(DType t) {
  switch (t) {
  case DType::F32: case DType::I32: case DType::U32: return 4;
  case DType::U8: case DType::I8: case DType::Bool: return 1;
  case DType::F8E4M3FN: case DType::F8E4M3FNUZ: case DType::F8E5M2: case DType::F8E5M2FNUZ:
  case DType::U4: case DType::I4: case DType::U2: case DType::I2: case DType::F4E2M1: case DType::F8E8M0: return 1;
  case DType::U16: case DType::I16: case DType::F16: case DType::BF16: return 2;
  case DType::I64: case DType::F64: case DType::U64: return 8;
  default: return 0;
  }
}

const char *dtypeName(DType t) {
  switch (t) {
  case DType::F32: return "f32";
  case DType::U8: return "u8";
  case DType::I8: return "i8";
  case DType::U16: return "u16";
  case DType::I16: return "i16";
  case DType::I32: return "i32";
  case DType::I64: return "i64";
  case DType::String: return "string";
  case DType::Bool: return "bool";
  case DType::F16: return "f16";
  case DType::F64: return "f64";
  case DType::U32: return "u32";
  case DType::U64: return "u64";
  case DType::BF16: return "bf16";
  case DType::F8E4M3FN: return "f8e4m3fn";
  case DType::F8E4M3FNUZ: return "f8e4m3fnuz";
  case DType::F8E5M2: return "f8e5m2";
  case DType::F8E5M2FNUZ: return "f8e5m2fnuz";
  case DType::U4: return "u4";
  case DType::I4: return "i4";
  case DType::U2: return "u2";
  case DType::I2: return "i2";
  case DType::F4E2M1: return "f4e2m1";
  case DType::F8E8M0: return "f8e8m0";
  default: return "undefined";
  }
}

bool dtypeIsFloat(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}
bool dtypeIsInteger(DType t) {
  switch (t) {
  case DType::U8: case DType::I8: case DType::U16: case DType::I16:
  case DType::I32: case DType::I64: case DType::U32: case DType::U64: return true;
  default: return false;
  }
}
bool dtypeIsKnown(int32_t raw) {
  return dtypeSize(DType(raw)) != 0;
}

float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else { // subnormal
      float f = std::ldexp(float(man), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    man |= 0x800000;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return uint16_t(half);
}

uint16_t floatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1); // round to nearest even
  return uint16_t(u >> 16);
}

} // namespace sd

namespace sd {

bool dtypeIsFloat8(DType t) {
  return t == DType::F8E4M3FN || t == DType::F8E4M3FNUZ || t == DType::F8E5M2 || t == DType::F8E5M2FNUZ;
}
bool dtypeIsNarrowFloat(DType t) { return dtypeIsFloat8(t) || t == DType::F4E2M1 || t == DType::F8E8M0; }
bool dtypeIsNarrow(DType t) {
  return dtypeIsNarrowFloat(t) || t == DType::U4 || t == DType::I4 || t == DType::U2 || t == DType::I2;
}

namespace {

struct Float8Format {
  int mantissaBits, bias;
  bool fnuz;   // no infinity, no -0; 0x80 is the NaN
  bool hasInf; // E5M2: exponent all ones is inf (mantissa 0) or NaN
};

Float8Format formatOf(DType t) {
  switch (t) {
  case DType::F8E4M3FN: return {3, 7, false, false};
  case DType::F8E4M3FNUZ: return {3, 8, true, false};
  case DType::F8E5M2: return {2, 15, false, true};
  default: return {2, 16, true, false}; // F8E5M2FNUZ
  }
}

float decode(uint8_t code, const Float8Format &f) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int expBits = 7 - f.mantissaBits, e = (code >> f.mantissaBits) & ((1 << expBits) - 1);
  int m = code & ((1 << f.mantissaBits) - 1);
  bool negative = code & 0x80;
  if (f.fnuz && code == 0x80) return nan;
  if (f.hasInf && e == (1 << expBits) - 1) return m ? nan : (negative ? -1.f : 1.f) * std::numeric_limits<float>::infinity();
  if (!f.fnuz && !f.hasInf && (code & 0x7f) == 0x7f) return nan; // E4M3FN: S.1111.111
  float v = e == 0 ? std::ldexp(float(m), 1 - f.bias - f.mantissaBits)
                   : std::ldexp(1.f + float(m) / float(1 << f.mantissaBits), e - f.bias);
  return negative ? -v : v;
}

// Every code's value, and the positive finite ones in increasing order (codes
// 0x00 up to the largest finite one are monotonic in value).
struct Float8Table {
  std::array<float, 256> value{};
  uint8_t maxFinite = 0;
};

const Float8Table &tableOf(DType t) {
  static const auto build = [](DType dt) {
    Float8Table table;
    Float8Format f = formatOf(dt);
    for (int c = 0; c < 256; ++c) table.value[size_t(c)] = decode(uint8_t(c), f);
    for (int c = 0; c < 128; ++c)
      if (std::isfinite(table.value[size_t(c)])) table.maxFinite = uint8_t(c);
    return table;
  };
  static const Float8Table e4m3fn = build(DType::F8E4M3FN), e4m3fnuz = build(DType::F8E4M3FNUZ),
                           e5m2 = build(DType::F8E5M2), e5m2fnuz = build(DType::F8E5M2FNUZ);
  switch (t) {
  case DType::F8E4M3FN: return e4m3fn;
  case DType::F8E4M3FNUZ: return e4m3fnuz;
  case DType::F8E5M2: return e5m2;
  default: return e5m2fnuz;
  }
}

// Float4 E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; no inf or NaN.
constexpr float kFloat4Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint8_t floatToFloat4(float x) {
  // No NaN in float4: ml_dtypes (ONNX's reference) gives a zero of the
  // opposite sign, -0 for a positive NaN.
  if (std::isnan(x)) return std::signbit(x) ? 0x0 : 0x8;
  uint8_t sign = std::signbit(x) ? 0x8 : 0;
  float a = std::fabs(x);
  uint8_t code = 7;
  for (uint8_t c = 0; c < 7; ++c) {
    float mid = (kFloat4Values[c] + kFloat4Values[c + 1]) / 2;
    if (a < mid || (a == mid && (c & 1) == 0)) { code = c; break; }
  }
  return uint8_t(sign | code);
}

// E8M0: 2^(code - 127), code 255 the NaN; the sign is dropped.
uint8_t floatToE8M0(float x, bool saturate, PowerOfTwoRounding rounding) {
  if (!std::isfinite(x)) return 0xff;
  uint32_t bits;
  float a = std::fabs(x);
  std::memcpy(&bits, &a, 4);
  uint32_t exp = bits >> 23, man = bits & 0x7fffff;
  if (exp == 0) { // zero and subnormals lie between code 0 (2^-127) and code 1 (2^-126)
    const float lo = std::ldexp(1.0f, -127);
    bool up = rounding == PowerOfTwoRounding::Up ? a > lo : rounding == PowerOfTwoRounding::Nearest && a >= 1.5f * lo;
    return up ? 1 : 0;
  }
  uint32_t code = exp;
  if (rounding == PowerOfTwoRounding::Up && man != 0) ++code;
  if (rounding == PowerOfTwoRounding::Nearest && man >= 0x400000) ++code;
  if (code >= 0xff) return saturate ? 0xfe : 0xff;
  return uint8_t(code);
}

} // namespace

float float8ToFloat(uint8_t code, DType t) {
  if (t == DType::F4E2M1) return (code & 0x8 ? -1.0f : 1.0f) * kFloat4Values[code & 0x7];
  if (t == DType::F8E8M0) return code == 0xff ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, int(code) - 127);
  return tableOf(t).value[code];
}

uint8_t floatToFloat8(float x, DType t, bool saturate, PowerOfTwoRounding e8m0) {
  if (t == DType::F4E2M1) return floatToFloat4(x);
  if (t == DType::F8E8M0) return floatToE8M0(x, saturate, e8m0);
  const Float8Table &table = tableOf(t);
  Float8Format f = formatOf(t);
  uint8_t nanCode = f.fnuz ? 0x80 : 0x7f, sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return nanCode;
  float a = std::fabs(x), max = table.value[table.maxFinite];
  uint8_t overflow = saturate ? table.maxFinite : f.hasInf ? uint8_t(table.maxFinite + 1) : nanCode;
  if (std::isinf(a)) return (overflow == nanCode && f.fnuz) ? nanCode : uint8_t(sign | overflow);
  // The value one step past the largest finite one, were the format wider:
  // halfway to it is where rounding starts to overflow.
  float next = max + (max - table.value[table.maxFinite - 1]);
  float mid = (max + next) / 2;
  uint8_t code;
  if (a > mid || (a == mid && (table.maxFinite & 1))) {
    code = overflow;
    if (code == nanCode) return nanCode;
  } else if (a >= max) {
    code = table.maxFinite;
  } else {
    const float *v = table.value.data();
    const float *hi = std::lower_bound(v, v + table.maxFinite + 1, a); // first value >= a
    code = uint8_t(hi - v);
    if (*hi != a && code > 0) {
      float up = *hi - a, down = a - v[code - 1];
      if (down < up || (down == up && ((code - 1) & 1) == 0)) --code;
    }
  }
  if (f.fnuz && code == 0) return 0; // no negative zero
  return uint8_t(sign | code);
}

int64_t wrapNarrowInteger(int64_t v, DType t) {
  int bits = (t == DType::I4 || t == DType::U4) ? 4 : 2;
  int64_t mask = (int64_t(1) << bits) - 1, u = v & mask;
  if (t == DType::I4 || t == DType::I2) return u >= (int64_t(1) << (bits - 1)) ? u - (mask + 1) : u;
  return u;
}

static int packedBits(DType t) {
  return (t == DType::I4 || t == DType::U4 || t == DType::F4E2M1) ? 4 : (t == DType::I2 || t == DType::U2) ? 2 : 8;
}

size_t packedSize(DType t, int64_t n) {
  int bits = packedBits(t);
  return bits == 8 ? size_t(n) * dtypeSize(t) : size_t((n * bits + 7) / 8);
}

void unpackNarrow(DType t, const uint8_t *packed, int64_t n, uint8_t *out) {
  int bits = packedBits(t), perByte = 8 / bits;
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = (packed[i / perByte] >> ((i % perByte) * bits)) & ((1 << bits) - 1);
    out[i] = t == DType::F4E2M1 ? uint8_t(v) : uint8_t(int8_t(wrapNarrowInteger(v, t)));
  }
}

void packNarrow(DType t, const uint8_t *elems, int64_t n, uint8_t *out) {
  int bits = packedBits(t), perByte = 8 / bits;
  std::fill(out, out + packedSize(t, n), uint8_t(0));
  for (int64_t i = 0; i < n; ++i)
    out[i / perByte] |= uint8_t((elems[i] & ((1 << bits) - 1)) << ((i % perByte) * bits));
}

} // namespace sd
