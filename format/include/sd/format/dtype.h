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
};

size_t dtypeSize(DType t); // 0 for unsupported types
const char *dtypeName(DType t);
bool dtypeIsFloat(DType t);   // f16, bf16, f32, f64
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

} // namespace sd
