// DType helpers: sizes, names, IEEE half and bfloat16 conversion.
#include "sd/format/dtype.h"
#include <cmath>

namespace sd {
size_t dtypeSize(DType t) {
  switch (t) {
  case DType::F32: case DType::I32: case DType::U32: return 4;
  case DType::U8: case DType::I8: case DType::Bool: return 1;
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
