// Element types, numbered as ONNX's TensorProto.DataType so files map 1:1.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace sd {

enum class DType : int32_t {
  Undefined = 0,
  F32 = 1,
  U8 = 2,
  I8 = 3,
  U16 = 4,
  I16 = 5,
  I32 = 6,
  I64 = 7,
  String = 8,
  Bool = 9,
  F16 = 10,
  F64 = 11,
  U32 = 12,
  U64 = 13,
  BF16 = 16,
  F8E4M3FN = 17,
  F8E4M3FNUZ = 18,
  F8E5M2 = 19,
  F8E5M2FNUZ = 20,
  U4 = 21,
  I4 = 22,
  F4E2M1 = 23,
  F8E8M0 = 24,
  U2 = 25,
  I2 = 26,
};

size_t dtypeSize(DType t); // 0 for unsupported types
const char *dtypeName(DType t);
bool dtypeIsFloat(DType t);   // f16, bf16, f32, f64
// f16 and bf16: storage types on the CPU, computed through f32.
inline bool dtypeIsHalf(DType t) { return t == DType::F16 || t == DType::BF16; }
bool dtypeIsInteger(DType t); // signed and unsigned, not bool
bool dtypeIsKnown(int32_t raw);

// IEEE half / bfloat16 conversion: these are storage types; compute is f32.
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
inline float bf16ToFloat(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t floatToBf16(float f);

// Narrow storage types: float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ), E8M0 (a
// power-of-two scale), float4 E2M1 and 4- and 2-bit integers. In memory each
// element is one byte (integers sign- or zero-extended, float4 its 4-bit
// code), so kernels index them like u8/i8; only ONNX files pack the 4- and
// 2-bit types, two or four to a byte, low bits first. Only Cast/CastLike, the
// quantization ops and the byte-moving ops (reshape, transpose, gather,
// concat, ...) take them.
bool dtypeIsNarrow(DType t);
bool dtypeIsFloat8(DType t);      // the four float8 types with a mantissa
bool dtypeIsNarrowFloat(DType t); // those, E8M0 and float4 E2M1
float float8ToFloat(uint8_t code, DType t); // any narrow float
// E8M0 has no mantissa: a value between two powers of two rounds up (ONNX's
// default), down, or to the nearer (ties up).
enum class PowerOfTwoRounding { Up, Down, Nearest };
// Round to nearest even. Out of range (and infinities): the largest finite
// value when `saturate`, else infinity (E5M2) or NaN (the others, which have
// no infinity), as ONNX's Cast specifies. Float4 always saturates and takes
// NaN to a zero of the opposite sign (as ml_dtypes); E8M0 takes |x|, NaN and infinity to its NaN.
uint8_t floatToFloat8(float x, DType t, bool saturate, PowerOfTwoRounding e8m0 = PowerOfTwoRounding::Up);
// An integer wrapped into a 4- or 2-bit type (two's complement for signed), as
// ONNX's Cast does.
int64_t wrapNarrowInteger(int64_t v, DType t);
// ONNX's packing of the 4- and 2-bit integers; other types are one byte each.
size_t packedSize(DType t, int64_t n);
void unpackNarrow(DType t, const uint8_t *packed, int64_t n, uint8_t *out);
void packNarrow(DType t, const uint8_t *elems, int64_t n, uint8_t *out);

} // namespace sd
