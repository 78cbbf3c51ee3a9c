// safetensors reader and atomic writer.
#include "sd/format/safetensors.h"
#include "sd/format/json.h"
#include "sd/format/dtype.h"
#include <algorithm>
#include <cmath>
#include <cstring>

namespace sd {

const char *safetensorsDtypeName(DType t) {
  switch (t) {
  case DType::F32: return "F32";
  case DType::F64: return "F64";
  case DType::F16: return "F16";
  case DType::BF16: return "BF16";
  case DType::I8: return "I8";
  case DType::I16: return "I16";
  case DType::I32: return "I32";
  case DType::I64: return "I64";
  case DType::U8: return "U8";
  case DType::U16: return "U16";
  case DType::U32: return "U32";
  case DType::U64: return "U64";
  case DType::Bool: return "BOOL";
  default: return nullptr;
  }
}

Status writeSafetensors(const std::string &path, const std::vector<NamedTensor> &tensors,
                        const std::map<std::string, std::string> &metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (auto &[k, v] : metadata) header += (std::exchange(first, false) ? "" : ",") + jsonQuote(k) + ":" + jsonQuote(v);
    header += "}";
  }
  uint64_t off = 0;
  for (const NamedTensor &t : tensors) {
    const char *dt = safetensorsDtypeName(t.dtype);
    if (!dt) return sdError(path, ": tensor '", t.name, "' has a dtype safetensors cannot store");
    header += std::string(header.size() > 1 ? "," : "") + jsonQuote(t.name) + ":{\"dtype\":\"" + dt + "\",\"shape\":[";
    for (size_t d = 0; d < t.dims.size(); ++d) header += (d ? "," : "") + std::to_string(t.dims[d]);
    header += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + t.bytes) + "]}";
    off += t.bytes;
  }
  header += "}";
  while ((8 + header.size()) % 8) header += ' ';
  uint64_t hlen = header.size();
  std::vector<std::pair<const void *, size_t>> pieces = {{&hlen, 8}, {header.data(), header.size()}};
  for (const NamedTensor &t : tensors) pieces.push_back({t.data, t.bytes});
  SD_RETURN_IF_ERROR(writeFileAtomic(path, pieces));
  return syncDirectory(parentDirectory(path));
}

static DType dtypeFromName(const std::string &s) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I16, DType::I32, DType::I64,
                  DType::U8, DType::U16, DType::U32, DType::U64, DType::Bool})
    if (s == safetensorsDtypeName(t)) return t;
  return DType::Undefined;
}

Status parseSafetensors(const uint8_t *b, size_t size, const std::string &what,
                        std::map<std::string, NamedTensor> &tensors, std::map<std::string, std::string> *metadata) {
  uint64_t hlen = 0;
  if (size < 8) return sdError(what, ": truncated safetensors file");
  std::memcpy(&hlen, b, 8);
  if (hlen > size - 8 || hlen > (64u << 20)) return sdError(what, ": bad safetensors header size");
  auto header = parseJson(std::string(reinterpret_cast<const char *>(b + 8), size_t(hlen)), what);
  if (!header.isOk()) return header.status();
  if (header.value().type != Json::Type::Object) return sdError(what, ": safetensors header is not an object");
  size_t base = 8 + size_t(hlen);
  std::vector<std::pair<uint64_t, uint64_t>> spans; // data_offsets of every tensor
  for (const auto &[name, e] : header.value().obj) {
    if (name == "__metadata__") {
      if (metadata)
        for (const auto &[k, v] : e.obj)
          if (v.type == Json::Type::String) (*metadata)[k] = v.str;
      continue;
    }
    const Json *dt = e.get("dtype"), *shape = e.get("shape"), *offs = e.get("data_offsets");
    if (!dt || !shape || !offs || shape->type != Json::Type::Array || offs->type != Json::Type::Array ||
        offs->arr.size() != 2 || !offs->arr[0].isInteger() || !offs->arr[1].isInteger())
      return sdError(what, ": tensor '", name, "' has a malformed header entry");
    NamedTensor t;
    t.name = name;
    t.dtype = dtypeFromName(dt->str);
    if (t.dtype == DType::Undefined) return sdError(what, ": tensor '", name, "' has unsupported dtype '", dt->str, "'");
    for (const Json &d : shape->arr) {
      if (!d.isInteger() || d.num < 0 || d.num > double(int64_t(1) << 40))
        return sdError(what, ": tensor '", name, "' has a bad shape");
      t.dims.push_back(int64_t(d.num));
    }
    int64_t lo = int64_t(offs->arr[0].num), hi = int64_t(offs->arr[1].num);
    if (lo < 0 || hi < lo || base + size_t(hi) > size) return sdError(what, ": tensor '", name, "' lies outside the file");
    t.bytes = size_t(hi - lo);
    if (t.bytes != size_t(product(t.dims)) * dtypeSize(t.dtype))
      return sdError(what, ": tensor '", name, "' holds ", t.bytes, " bytes, its shape needs ",
                     size_t(product(t.dims)) * dtypeSize(t.dtype));
    t.data = b + base + size_t(lo);
    tensors[name] = t;
    spans.push_back({uint64_t(lo), uint64_t(hi)});
  }
  // The format's rule: the data section is exactly the tensors, in any
  // order, with no overlap, gap or trailing bytes (a file that breaks it is
  // torn or crafted, and two tensors sharing bytes would alias).
  std::sort(spans.begin(), spans.end());
  uint64_t covered = 0;
  for (auto [lo, hi] : spans) {
    if (lo != covered)
      return sdError(what, ": tensor data ", lo < covered ? "overlaps" : "has a gap", " at byte ", base + lo);
    covered = hi;
  }
  if (base + covered != size)
    return sdError(what, ": ", size - base - covered, " bytes after the last tensor (a torn or padded file?)");
  return Status::ok();
}

Status checkFiniteValues(const NamedTensor &t, const std::string &what) {
  size_t n = t.bytes / std::max<size_t>(dtypeSize(t.dtype), 1);
  const auto *p = static_cast<const uint8_t *>(t.data);
  for (size_t i = 0; i < n; ++i) {
    double v;
    switch (t.dtype) {
    case DType::F32: { float f; std::memcpy(&f, p + 4 * i, 4); v = f; break; }
    case DType::F64: std::memcpy(&v, p + 8 * i, 8); break;
    case DType::F16: case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      // All-ones exponent is Inf or NaN in both half formats.
      bool f16 = t.dtype == DType::F16;
      bool bad = f16 ? (h & 0x7c00) == 0x7c00 : (h & 0x7f80) == 0x7f80;
      v = !bad ? 0 : (h & (f16 ? 0x3ff : 0x7f)) ? NAN : INFINITY;
      break;
    }
    default: return Status::ok();
    }
    if (!std::isfinite(v))
      return sdError(what, ": tensor '", t.name, "' holds ", std::isnan(v) ? "NaN" : "Inf", " (element ", i,
                     "); refusing to load it");
  }
  return Status::ok();
}

StatusOr<SafetensorsFile> readSafetensors(const std::string &path, bool requireFinite) {
  SafetensorsFile file;
  auto bytes = readWholeFile(path);
  if (!bytes.isOk()) return bytes.status();
  file.bytes = std::move(bytes.value());
  SD_RETURN_IF_ERROR(parseSafetensors(reinterpret_cast<const uint8_t *>(file.bytes.data()), file.bytes.size(), path,
                                      file.tensors, &file.metadata));
  if (requireFinite)
    for (const auto &[name, t] : file.tensors) SD_RETURN_IF_ERROR(checkFiniteValues(t, path));
  return file;
}

} // namespace sd
