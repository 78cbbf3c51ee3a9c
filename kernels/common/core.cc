// dtype helpers, attribute map, tensor-shape helpers.
#include "sd/ops/attrs.h"
#include "sd/ops/dtype.h"
#include "sd/ops/tensor.h"
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

Attr &AttrMap::slot(const std::string &n) {
  for (auto &e : entries_)
    if (e.first == n) return e.second = Attr();
  entries_.emplace_back(n, Attr());
  return entries_.back().second;
}
void AttrMap::setInt(const std::string &n, int64_t v) {
  Attr &a = slot(n); a.kind = Attr::Kind::Int; a.i = v;
}
void AttrMap::setFloat(const std::string &n, double v) {
  Attr &a = slot(n); a.kind = Attr::Kind::Float; a.f = v;
}
void AttrMap::setString(const std::string &n, std::string v) {
  Attr &a = slot(n); a.kind = Attr::Kind::String; a.s = std::move(v);
}
void AttrMap::setInts(const std::string &n, std::vector<int64_t> v) {
  Attr &a = slot(n); a.kind = Attr::Kind::Ints; a.ints = std::move(v);
}
void AttrMap::setFloats(const std::string &n, std::vector<double> v) {
  Attr &a = slot(n); a.kind = Attr::Kind::Floats; a.floats = std::move(v);
}
const Attr *AttrMap::find(const std::string &n) const {
  for (auto &e : entries_)
    if (e.first == n) return &e.second;
  return nullptr;
}
int64_t AttrMap::getInt(const std::string &n, int64_t def) const {
  const Attr *a = find(n);
  if (!a) return def;
  return a->kind == Attr::Kind::Float ? int64_t(a->f) : a->i;
}
double AttrMap::getFloat(const std::string &n, double def) const {
  const Attr *a = find(n);
  if (!a) return def;
  return a->kind == Attr::Kind::Int ? double(a->i) : a->f;
}
std::string AttrMap::getString(const std::string &n, const std::string &def) const {
  const Attr *a = find(n);
  return a && a->kind == Attr::Kind::String ? a->s : def;
}
std::vector<int64_t> AttrMap::getInts(const std::string &n) const {
  const Attr *a = find(n);
  return a && a->kind == Attr::Kind::Ints ? a->ints : std::vector<int64_t>{};
}
std::vector<double> AttrMap::getFloats(const std::string &n) const {
  const Attr *a = find(n);
  return a && a->kind == Attr::Kind::Floats ? a->floats : std::vector<double>{};
}

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
  case DType::I8: readAs<int8_t>(t, out); return true;
  case DType::U8: readAs<uint8_t>(t, out); return true;
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
  default: {
    std::vector<int64_t> iv;
    if (!readIntegers(t, iv)) return false;
    for (int64_t i = 0; i < n; ++i) out[i] = double(iv[i]);
    return true;
  }
  }
}

} // namespace sd
