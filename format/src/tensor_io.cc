// TensorProto wire-format codec and .npy codec, with size checks on every read.
#include "sd/format/tensor_io.h"
#include <cstdio>
#include <cstring>
#include <sstream>

namespace sd {
namespace {

class Reader {
public:
  Reader(const uint8_t *p, size_t n) : p_(p), end_(p + n) {}
  bool done() const { return p_ >= end_; }
  bool varint(uint64_t &v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) return false;
      uint8_t b = *p_++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  bool bytes(size_t n, const uint8_t *&out) {
    if (size_t(end_ - p_) < n) return false;
    out = p_;
    p_ += n;
    return true;
  }
  // One scalar of wire type 0 (varint), 5 (fixed32) or 1 (fixed64).
  bool element(int wire, uint64_t &v) {
    if (wire == 0) return varint(v);
    const uint8_t *e;
    size_t n = wire == 5 ? 4 : 8;
    if (!bytes(n, e)) return false;
    v = 0;
    std::memcpy(&v, e, n);
    return true;
  }
  bool skip(int wire) {
    uint64_t v;
    const uint8_t *b;
    switch (wire) {
    case 0: return varint(v);
    case 1: return bytes(8, b);
    case 2: return varint(v) && bytes(size_t(v), b);
    case 5: return bytes(4, b);
    default: return false;
    }
  }

private:
  const uint8_t *p_, *end_;
};

void putVarint(std::string &s, uint64_t v) {
  while (v >= 0x80) {
    s += char(uint8_t(v) | 0x80);
    v >>= 7;
  }
  s += char(v);
}

} // namespace

StatusOr<HostTensor> decodeTensorProto(const uint8_t *bytes, size_t size, const std::string &what) {
  Reader r(bytes, size);
  HostTensor t;
  int32_t dtype = 0;
  std::vector<uint8_t> raw;
  bool haveRaw = false;
  std::vector<uint64_t> ints;     // int32_data / int64_data / uint64_data
  std::vector<uint32_t> floats32; // float_data bit patterns
  std::vector<uint64_t> doubles;  // double_data bit patterns
  auto bad = [&](const char *m) { return sdError(what, ": not a valid TensorProto (", m, ")"); };
  while (!r.done()) {
    uint64_t key;
    if (!r.varint(key)) return bad("truncated field key");
    int field = int(key >> 3), wire = int(key & 7);
    // Repeated scalars come packed (one length-delimited run) or one per key.
    auto readRepeated = [&](int elemWire, auto &&push) -> bool {
      uint64_t v;
      if (wire != 2) {
        if (wire != elemWire || !r.element(elemWire, v)) return false;
        push(v);
        return true;
      }
      uint64_t len;
      const uint8_t *b;
      if (!r.varint(len) || !r.bytes(size_t(len), b)) return false;
      Reader sub(b, size_t(len));
      while (!sub.done()) {
        if (!sub.element(elemWire, v)) return false;
        push(v);
      }
      return true;
    };
    bool ok = true;
    switch (field) {
    case 1: ok = readRepeated(0, [&](uint64_t v) { t.dims.push_back(int64_t(v)); }); break;
    case 2: {
      uint64_t v = 0; // read only when the wire type is a varint
      ok = wire == 0 && r.varint(v);
      dtype = int32_t(v);
      break;
    }
    case 4: ok = readRepeated(5, [&](uint64_t v) { floats32.push_back(uint32_t(v)); }); break;
    case 5: case 7: case 11: ok = readRepeated(0, [&](uint64_t v) { ints.push_back(v); }); break;
    case 10: ok = readRepeated(1, [&](uint64_t v) { doubles.push_back(v); }); break;
    case 8: case 9: {
      uint64_t len;
      const uint8_t *b;
      ok = wire == 2 && r.varint(len) && r.bytes(size_t(len), b);
      if (ok && field == 8) t.name.assign(reinterpret_cast<const char *>(b), size_t(len));
      if (ok && field == 9) { raw.assign(b, b + len); haveRaw = true; }
      break;
    }
    case 14: {
      uint64_t v;
      ok = wire == 0 && r.varint(v);
      if (ok && v == 1) return sdError(what, ": tensor uses external data, which tensor files cannot");
      break;
    }
    default: ok = r.skip(wire);
    }
    if (!ok) return bad("truncated or malformed field");
  }
  if (!dtypeIsKnown(dtype)) return sdError(what, ": unsupported tensor data type ", dtype);
  t.dtype = DType(dtype);
  int64_t n = 1;
  for (int64_t d : t.dims) {
    if (d < 0 || d > (int64_t(1) << 40)) return sdError(what, ": bad dim ", d);
    if (d && n > (int64_t(1) << 40) / d) return sdError(what, ": tensor too large");
    n *= d;
  }
  // The declared shape is only a claim: check it against the values the
  // file actually holds before allocating anything for it.
  size_t es = dtypeSize(t.dtype), need = size_t(n) * es, packed = packedSize(t.dtype, n);
  if (haveRaw) {
    if (raw.size() != packed)
      return sdError(what, ": raw_data holds ", raw.size(), " bytes, shape ", formatDims(t.dims), " needs ", packed);
    if (packed == need) {
      t.data = std::move(raw);
    } else { // 4- and 2-bit integers: one byte each in memory
      t.data.resize(need);
      unpackNarrow(t.dtype, raw.data(), n, t.data.data());
    }
    return t;
  }
  if (packed != need && ints.size() == packed) { // int32_data holding the packed bytes
    std::vector<uint8_t> bytes(ints.begin(), ints.end());
    t.data.resize(need);
    if (n) unpackNarrow(t.dtype, bytes.data(), n, t.data.data());
    return t;
  }
  size_t count = t.dtype == DType::F32 ? floats32.size() : t.dtype == DType::F64 ? doubles.size() : ints.size();
  if (count != size_t(n))
    return sdError(what, ": holds ", count, " values, shape ", formatDims(t.dims), " needs ", n);
  t.data.resize(need);
  if (need == 0) return t; // an empty tensor: no values to copy (and data() may be null)
  if (t.dtype == DType::F32) std::memcpy(t.data.data(), floats32.data(), need);
  else if (t.dtype == DType::F64) std::memcpy(t.data.data(), doubles.data(), need);
  else
    for (size_t i = 0; i < count; ++i) std::memcpy(t.data.data() + i * es, &ints[i], es);
  return t;
}

std::string encodeTensorProto(const HostTensor &t) {
  std::string s;
  for (int64_t d : t.dims) {
    putVarint(s, (1 << 3) | 0);
    putVarint(s, uint64_t(d));
  }
  putVarint(s, (2 << 3) | 0);
  putVarint(s, uint64_t(t.dtype));
  if (!t.name.empty()) {
    putVarint(s, (8 << 3) | 2);
    putVarint(s, t.name.size());
    s += t.name;
  }
  int64_t n = product(t.dims);
  std::vector<uint8_t> packed;
  const std::vector<uint8_t> *raw = &t.data;
  if (packedSize(t.dtype, n) != t.data.size() && t.data.size() == size_t(n)) { // ONNX packs 4- and 2-bit integers
    packed.resize(packedSize(t.dtype, n));
    packNarrow(t.dtype, t.data.data(), n, packed.data());
    raw = &packed;
  }
  putVarint(s, (9 << 3) | 2);
  putVarint(s, raw->size());
  s.append(reinterpret_cast<const char *>(raw->data()), raw->size());
  return s;
}

static const char *npyDescr(DType t) {
  switch (t) {
  case DType::F32: return "<f4";
  case DType::F64: return "<f8";
  case DType::F16: return "<f2";
  case DType::I8: return "|i1";
  case DType::U8: return "|u1";
  case DType::I16: return "<i2";
  case DType::U16: return "<u2";
  case DType::I32: return "<i4";
  case DType::U32: return "<u4";
  case DType::I64: return "<i8";
  case DType::U64: return "<u8";
  case DType::Bool: return "|b1";
  case DType::I4: case DType::I2: return "|i1"; // one sign-extended byte each
  case DType::U4: case DType::U2: return "|u1";
  default: return nullptr;
  }
}

StatusOr<NpyHeader> parseNpyHeader(const uint8_t *b, size_t size, const std::string &what) {
  if (size < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) return sdError(what, ": not a .npy file");
  int major = b[6];
  size_t hlen, hoff;
  if (major == 1) { hlen = size_t(b[8]) | (size_t(b[9]) << 8); hoff = 10; }
  else {
    if (size < 12) return sdError(what, ": truncated .npy header");
    hlen = size_t(b[8]) | (size_t(b[9]) << 8) | (size_t(b[10]) << 16) | (size_t(b[11]) << 24);
    hoff = 12;
  }
  if (hoff + hlen > size) return sdError(what, ": truncated .npy header");
  std::string h(reinterpret_cast<const char *>(b + hoff), hlen);
  auto field = [&](const std::string &key) -> std::string {
    size_t p = h.find("'" + key + "'");
    if (p == std::string::npos) return "";
    p = h.find(':', p);
    if (p == std::string::npos) return "";
    ++p;
    while (p < h.size() && h[p] == ' ') ++p;
    if (p >= h.size()) return "";
    if (h[p] == '\'') {
      size_t e = h.find('\'', p + 1);
      return e == std::string::npos ? "" : h.substr(p + 1, e - p - 1);
    }
    if (h[p] == '(') {
      size_t e = h.find(')', p);
      return e == std::string::npos ? "" : h.substr(p + 1, e - p - 1);
    }
    size_t e = h.find_first_of(",}", p);
    return h.substr(p, e == std::string::npos ? std::string::npos : e - p);
  };
  NpyHeader t;
  std::string descr = field("descr");
  for (int d = 0; d <= 16; ++d)
    if (npyDescr(DType(d)) && descr == npyDescr(DType(d))) t.dtype = DType(d);
  if (t.dtype == DType::Undefined) return sdError(what, ": unsupported .npy dtype '", descr, "'");
  if (field("fortran_order").find("True") != std::string::npos)
    return sdError(what, ": Fortran-ordered .npy arrays are not supported");
  std::string shape = field("shape");
  std::stringstream ss(shape);
  std::string item;
  int64_t n = 1;
  while (std::getline(ss, item, ',')) {
    size_t f = item.find_first_not_of(" ");
    if (f == std::string::npos) continue;
    char *end;
    long long v = std::strtoll(item.c_str() + f, &end, 10);
    if (end == item.c_str() + f || item.find_first_not_of(" ", size_t(end - item.c_str())) != std::string::npos ||
        v < 0 || v > (1ll << 40))
      return sdError(what, ": bad .npy shape '", shape, "'");
    t.dims.push_back(v);
    if (v && n > (int64_t(1) << 40) / v) return sdError(what, ": tensor too large");
    n *= v;
  }
  size_t bytes = size_t(n) * dtypeSize(t.dtype);
  if (size - hoff - hlen != bytes)
    return sdError(what, ": .npy data holds ", size - hoff - hlen, " bytes, shape needs ", bytes);
  t.dataOffset = hoff + hlen;
  return t;
}

StatusOr<HostTensor> decodeNpy(const uint8_t *b, size_t size, const std::string &what) {
  auto h = parseNpyHeader(b, size, what);
  if (!h.isOk()) return h.status();
  HostTensor t;
  t.dtype = h.value().dtype;
  t.dims = h.value().dims;
  t.data.assign(b + h.value().dataOffset, b + size);
  return t;
}

StatusOr<MappedNpy> mapNpyFile(const std::string &path) {
  auto f = MappedFile::open(path);
  if (!f.isOk()) return f.status();
  MappedNpy out;
  out.file = std::move(f.value());
  auto h = parseNpyHeader(out.file->data, out.file->size, path);
  if (!h.isOk()) return h.status();
  out.dtype = h.value().dtype;
  out.dims = h.value().dims;
  out.data = out.file->data + h.value().dataOffset;
  return out;
}

std::string encodeNpy(const HostTensor &t) {
  std::string shape;
  for (size_t i = 0; i < t.dims.size(); ++i) shape += std::to_string(t.dims[i]) + (t.dims.size() == 1 ? "," : i + 1 < t.dims.size() ? ", " : "");
  const char *d = npyDescr(t.dtype);
  std::string h = std::string("{'descr': '") + (d ? d : "|u1") + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string s("\x93NUMPY\x01\x00", 8);
  s += char(h.size() & 0xff);
  s += char(h.size() >> 8);
  s += h;
  s.append(reinterpret_cast<const char *>(t.data.data()), t.data.size());
  return s;
}

StatusOr<HostTensor> readTensorFile(const std::string &path) {
  auto bytes = readWholeFile(path);
  if (!bytes.isOk()) return bytes.status();
  const std::string &s = bytes.value();
  auto *p = reinterpret_cast<const uint8_t *>(s.data());
  if (s.size() >= 6 && std::memcmp(p, "\x93NUMPY", 6) == 0) return decodeNpy(p, s.size(), path);
  if (s.empty()) return sdError(path, ": empty tensor file");
  return decodeTensorProto(p, s.size(), path);
}

} // namespace sd
