// Shape helpers and integer/float readers of tensor views.
#include "sd/format/tensor.h"
#include <cstring>

namespace sd {

bool TensorInfo::isStatic() const {
  if (!rankKnown) return false;
  for (int64_t d : dims)
    if (d < 0) return false;
  return true;
}
int64_t TensorInfo::numElements() const { return isStatic() ? product(dims) : -1; }

std::string formatDims(const Dims &d) {
  if (d.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += "x";
    s += d[i] < 0 ? "?" : std::to_string(d[i]);
  }
  return s;
}
int64_t product(const Dims &d) {
  int64_t p = 1;
  for (int64_t x : d) p *= x;
  return p;
}
Dims stridesOf(const Dims &d) {
  Dims s(d.size(), 1);
  for (int64_t i = int64_t(d.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * d[i + 1];
  return s;
}

bool keepPrefixAlong(std::vector<uint8_t> &bytes, Dims &dims, size_t elementSize, size_t axis, int64_t count) {
  int64_t bound = dims[axis];
  if (count < 0 || count > bound) return false;
  int64_t outer = product(Dims(dims.begin(), dims.begin() + int64_t(axis)));
  int64_t inner = product(Dims(dims.begin() + int64_t(axis) + 1, dims.end())) * int64_t(elementSize);
  for (int64_t o = 1; o < outer; ++o) // o = 0 is already in place
    std::memmove(bytes.data() + o * count * inner, bytes.data() + o * bound * inner, size_t(count * inner));
  dims[axis] = count;
  bytes.resize(size_t(outer * count * inner));
  return true;
}

template <typename T> static void readAs(const TensorView &t, std::vector<int64_t> &out) {
  int64_t n = t.numElements();
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = int64_t(static_cast<const T *>(t.data)[i]);
}
bool readIntegers(const TensorView &t, std::vector<int64_t> &out) {
  switch (t.dtype) {
  case DType::I64: readAs<int64_t>(t, out); return true;
  case DType::I32: readAs<int32_t>(t, out); return true;
  case DType::I16: readAs<int16_t>(t, out); return true;
  case DType::I8: case DType::I4: case DType::I2: readAs<int8_t>(t, out); return true;
  case DType::U8: case DType::U4: case DType::U2: readAs<uint8_t>(t, out); return true;
  case DType::U16: readAs<uint16_t>(t, out); return true;
  case DType::U32: readAs<uint32_t>(t, out); return true;
  case DType::U64: readAs<uint64_t>(t, out); return true;
  case DType::Bool: readAs<uint8_t>(t, out); return true;
  default: return false;
  }
}
bool readDoubles(const TensorView &t, std::vector<double> &out) {
  int64_t n = t.numElements();
  out.resize(static_cast<size_t>(n));
  switch (t.dtype) {
  case DType::F32: for (int64_t i = 0; i < n; ++i) out[i] = t.as<float>()[i]; return true;
  case DType::F64: for (int64_t i = 0; i < n; ++i) out[i] = t.as<double>()[i]; return true;
  case DType::F16: for (int64_t i = 0; i < n; ++i) out[i] = halfToFloat(t.as<uint16_t>()[i]); return true;
  case DType::BF16: for (int64_t i = 0; i < n; ++i) out[i] = bf16ToFloat(t.as<uint16_t>()[i]); return true;
  case DType::F8E4M3FN: case DType::F8E4M3FNUZ: case DType::F8E5M2: case DType::F8E5M2FNUZ:
  case DType::F4E2M1: case DType::F8E8M0:
    for (int64_t i = 0; i < n; ++i) out[i] = float8ToFloat(t.as<uint8_t>()[i], t.dtype);
    return true;
  default: {
    std::vector<int64_t> iv;
    if (!readIntegers(t, iv)) return false;
    for (int64_t i = 0; i < n; ++i) out[i] = double(iv[i]);
    return true;
  }
  }
}

} // namespace sd
