// The checkpoint manifest: its text and its checked reading.
#include "checkpoint_manifest.h"
#include "sd/format/crc32c.h"
#include "sd/format/json.h"
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace sd::checkpoint {
namespace {

constexpr const char *kSelfCrcKey = ",\"manifest_crc32c\":";
constexpr int kVersion = 3;
constexpr const char *kLegacyStateFile = "state.safetensors"; // version 2: the one state file

bool integerIn(const Json *v, double lo, double hi) { return v && v->isInteger() && v->num >= lo && v->num <= hi; }
bool crcField(const Json *v, uint32_t &out) {
  if (!integerIn(v, 0, 4294967295.0)) return false;
  out = uint32_t(v->num);
  return true;
}
// A file the manifest names must sit inside the checkpoint folder.
bool plainFileName(const std::string &n) {
  return !n.empty() && n.size() < 256 && n[0] != '.' && n.find('/') == std::string::npos && n.find('\0') == std::string::npos;
}

} // namespace

std::string stateFileName(int rank, int world) {
  if (world <= 1) return kLegacyStateFile;
  return "state-rank" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}

std::string manifestText(const Manifest &m) {
  std::string run, files, tensors;
  for (auto &[k, v] : m.meta.run) run += (run.empty() ? "" : ",") + jsonQuote(k) + ":" + jsonQuote(v);
  for (auto &[name, f] : m.files)
    files += (files.empty() ? "" : ",") + jsonQuote(name) + ":{\"rank\":" + std::to_string(f.rank) +
             ",\"bytes\":" + std::to_string(f.bytes) + ",\"crc32c\":" + std::to_string(f.crc) + "}";
  for (auto &[name, pieces] : m.tensors) {
    std::string list;
    for (const Piece &p : pieces)
      list += (list.empty() ? "" : ",") + std::string("{\"file\":") + jsonQuote(p.file) +
              ",\"first_row\":" + std::to_string(p.firstRow) + ",\"rows\":" + std::to_string(p.rows) +
              ",\"crc32c\":" + std::to_string(p.crc) + "}";
    tensors += (tensors.empty() ? "" : ",") + jsonQuote(name) + ":[" + list + "]";
  }
  std::string body = "{\"format\":\"sdc-checkpoint\",\"version\":" + std::to_string(kVersion) +
                     ",\"run\":" + jsonQuote(m.meta.runId) + ",\"step\":" + std::to_string(m.meta.step) +
                     ",\"total_steps\":" + std::to_string(m.meta.totalSteps) + ",\"epoch\":" + std::to_string(m.meta.epoch) +
                     ",\"position\":" + std::to_string(m.meta.position) + ",\"run_config\":{" + run + "}" +
                     ",\"world_size\":" + std::to_string(m.worldSize) + ",\"files\":{" + files + "},\"tensors\":{" +
                     tensors + "}";
  return body + kSelfCrcKey + std::to_string(crc32c(body.data(), body.size())) + "}\n";
}

StatusOr<Manifest> parseManifest(const std::string &t, const std::string &what) {
  size_t at = t.rfind(kSelfCrcKey);
  if (at == std::string::npos) return sdError("the manifest has no checksum (torn, or written by an older sdrun)");
  char *end = nullptr;
  const char *num = t.c_str() + at + std::strlen(kSelfCrcKey);
  errno = 0;
  unsigned long long want = std::strtoull(num, &end, 10);
  if (end == num || errno || want > 0xffffffffull || std::string(end) != "}\n" || crc32c(t.data(), at) != uint32_t(want))
    return sdError("the manifest fails its checksum");
  auto doc = parseJson(t, what);
  if (!doc.isOk()) return doc.status();
  const Json &m = doc.value();
  auto integer = [&](const char *key, int64_t &out) {
    const Json *v = m.get(key);
    if (!integerIn(v, 0, 9e15)) return false;
    out = int64_t(v->num);
    return true;
  };
  const auto malformed = [](const std::string &why) { return sdError("malformed manifest: ", why); };
  Manifest r;
  const Json *fmt = m.get("format"), *ver = m.get("version"), *run = m.get("run"), *cfg = m.get("run_config"),
             *files = m.get("files");
  if (!fmt || fmt->str != "sdc-checkpoint") return malformed("not an sdc checkpoint");
  if (!ver || !ver->isInteger() || (ver->num != kVersion && ver->num != 2))
    return malformed("version is not 2 or " + std::to_string(kVersion));
  const bool legacy = ver->num == 2;
  if (!run || run->type != Json::Type::String || !cfg || cfg->type != Json::Type::Object || !files ||
      files->type != Json::Type::Object || !integer("step", r.meta.step) || !integer("total_steps", r.meta.totalSteps) ||
      !integer("epoch", r.meta.epoch) || !integer("position", r.meta.position) || r.meta.step > r.meta.totalSteps)
    return malformed("a run field is missing or out of range");
  r.meta.runId = run->str;
  for (auto &[k, v] : cfg->obj) r.meta.run[k] = v.str;
  if (legacy) { // one state file, and a CRC32C per tensor
    const Json *state = files->get(kLegacyStateFile), *crcs = m.get("tensors_crc32c");
    StateFile f;
    if (!state || !integerIn(state->get("bytes"), 0, 9e15) || !crcField(state->get("crc32c"), f.crc) || !crcs ||
        crcs->type != Json::Type::Object)
      return malformed("the state file's entry");
    f.bytes = uint64_t(state->get("bytes")->num);
    r.files[kLegacyStateFile] = f;
    for (auto &[name, c] : crcs->obj) {
      Piece p{kLegacyStateFile, 0, -1, 0};
      if (!crcField(&c, p.crc)) return malformed("the checksum of '" + name + "'");
      r.tensors[name].push_back(p);
    }
    return r;
  }
  const Json *world = m.get("world_size"), *tensors = m.get("tensors");
  if (!integerIn(world, 1, 1 << 20) || !tensors || tensors->type != Json::Type::Object)
    return malformed("world_size or tensors");
  r.worldSize = int(world->num);
  for (auto &[name, f] : files->obj) {
    StateFile sf;
    if (!plainFileName(name) || !integerIn(f.get("rank"), 0, r.worldSize - 1) || !integerIn(f.get("bytes"), 0, 9e15) ||
        !crcField(f.get("crc32c"), sf.crc))
      return malformed("state file '" + name + "'");
    sf.rank = int(f.get("rank")->num);
    sf.bytes = uint64_t(f.get("bytes")->num);
    r.files[name] = sf;
  }
  for (auto &[name, list] : tensors->obj) {
    if (list.type != Json::Type::Array || list.arr.empty()) return malformed("tensor '" + name + "' has no pieces");
    for (const Json &p : list.arr) {
      Piece piece;
      const Json *file = p.get("file");
      if (!file || !r.files.count(file->str) || !integerIn(p.get("first_row"), 0, 9e15) ||
          !integerIn(p.get("rows"), 0, 9e15) || !crcField(p.get("crc32c"), piece.crc))
        return malformed("a piece of tensor '" + name + "'");
      piece.file = file->str;
      piece.firstRow = int64_t(p.get("first_row")->num);
      piece.rows = int64_t(p.get("rows")->num);
      r.tensors[name].push_back(piece);
    }
  }
  return r;
}

} // namespace sd::checkpoint
