// safetensors reader and atomic writer.
#include "sd/format/safetensors.h"
#include "sd/format/json.h"
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

static std::string folderOf(const std::string &path) {
  size_t s = path.find_last_of('/');
  return s == std::string::npos ? "." : s == 0 ? "/" : path.substr(0, s);
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
  return syncDirectory(folderOf(path));
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
  }
  return Status::ok();
}

StatusOr<SafetensorsFile> readSafetensors(const std::string &path) {
  SafetensorsFile file;
  auto bytes = readWholeFile(path);
  if (!bytes.isOk()) return bytes.status();
  file.bytes = std::move(bytes.value());
  SD_RETURN_IF_ERROR(parseSafetensors(reinterpret_cast<const uint8_t *>(file.bytes.data()), file.bytes.size(), path,
                                      file.tensors, &file.metadata));
  return file;
}

} // namespace sd
