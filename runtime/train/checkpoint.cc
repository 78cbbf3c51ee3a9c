// Crash-safe training checkpoints.
#include "sd/train/checkpoint.h"
#include "sd/format/crc32c.h"
#include "sd/format/json.h"
#include "sd/format/safetensors.h"
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd {
namespace {

constexpr const char *kPrefix = "checkpoint-";

std::vector<std::pair<int64_t, std::string>> listCheckpoints(const std::string &dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  if (DIR *d = ::opendir(dir.c_str())) {
    while (dirent *e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind(kPrefix, 0) != 0) continue;
      std::string num = n.substr(std::strlen(kPrefix));
      // At most 18 digits: a step count, never a number std::stoll cannot hold.
      if (num.empty() || num.size() > 18 || num.find_first_not_of("0123456789") != std::string::npos) continue;
      out.push_back({std::stoll(num), dir + "/" + n});
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void removeTree(const std::string &path) {
  if (DIR *d = ::opendir(path.c_str())) {
    while (dirent *e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") std::remove((path + "/" + n).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

} // namespace

Status saveCheckpoint(const std::string &dir, const Session &session, const CheckpointMeta &meta, int keep) {
  ::mkdir(dir.c_str(), 0755);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return sdError(dir, ": cannot create checkpoint folder");
  std::string name = kPrefix + std::to_string(meta.step);
  std::string tmp = dir + "/.tmp-" + name + "." + std::to_string(::getpid()), final = dir + "/" + name;
  removeTree(tmp);
  if (::mkdir(tmp.c_str(), 0755) != 0) return sdError(tmp, ": cannot create");
  std::vector<HostTensor> values;
  std::vector<NamedTensor> tensors;
  std::string crcs;
  const Plan &plan = session.plan();
  Status s;
  for (size_t i = 0; i < plan.globals.size() && s.isOk(); ++i) {
    if (!isMutableRole(plan.globals[i].role)) continue;
    auto v = session.readGlobal(i);
    if (!v.isOk()) s = v.status();
    else values.push_back(std::move(v.value()));
  }
  for (const HostTensor &v : values) {
    tensors.push_back({v.name, v.dtype, v.dims, v.data.data(), v.byteSize()});
    crcs += std::string(crcs.empty() ? "" : ",") + jsonQuote(v.name) + ":" + std::to_string(crc32c(v.data.data(), v.byteSize()));
  }
  if (s.isOk()) s = writeSafetensors(tmp + "/state.safetensors", tensors);
  std::string manifest = "{\"format\":\"sdc-checkpoint\",\"version\":1,\"step\":" + std::to_string(meta.step) +
                         ",\"epoch\":" + std::to_string(meta.epoch) + ",\"position\":" + std::to_string(meta.position) +
                         ",\"seed\":" + jsonQuote(std::to_string(meta.seed)) + ",\"crc32c\":{" + crcs + "}}\n";
  if (s.isOk()) s = writeFileAtomic(tmp + "/manifest.json", manifest);
  if (s.isOk()) s = syncDirectory(tmp);
  if (s.isOk()) {
    removeTree(final); // a checkpoint of the same step from an earlier run
    if (std::rename(tmp.c_str(), final.c_str()) != 0) s = sdError(final, ": cannot rename checkpoint into place");
  }
  if (!s.isOk()) {
    removeTree(tmp);
    return s;
  }
  SD_RETURN_IF_ERROR(syncDirectory(dir));
  auto all = listCheckpoints(dir);
  for (size_t i = 0; i + size_t(std::max(keep, 1)) < all.size(); ++i) removeTree(all[i].second);
  return Status::ok();
}

static Status restoreFrom(const std::string &path, Session &session, CheckpointMeta &meta) {
  auto text = readWholeFile(path + "/manifest.json");
  if (!text.isOk()) return sdError("no manifest");
  auto doc = parseJson(text.value(), path + "/manifest.json");
  if (!doc.isOk()) return doc.status();
  const Json &m = doc.value();
  const Json *fmt = m.get("format"), *step = m.get("step"), *epoch = m.get("epoch"), *pos = m.get("position"),
             *seed = m.get("seed"), *crcs = m.get("crc32c");
  if (!fmt || fmt->str != "sdc-checkpoint" || !step || !step->isInteger() || !epoch || !epoch->isInteger() || !pos ||
      !pos->isInteger() || !seed || seed->type != Json::Type::String || !crcs || crcs->type != Json::Type::Object)
    return sdError("malformed manifest");
  // The seed is a decimal uint64 string (JSON numbers lose precision above 2^53).
  char *end = nullptr;
  errno = 0;
  unsigned long long seedValue = std::strtoull(seed->str.c_str(), &end, 10);
  if (seed->str.empty() || seed->str.find_first_not_of("0123456789") != std::string::npos || *end || errno)
    return sdError("malformed manifest: bad seed '", seed->str, "'");
  auto file = readSafetensors(path + "/state.safetensors");
  if (!file.isOk()) return file.status();
  const Plan &plan = session.plan();
  // Verify everything before touching the session.
  std::vector<std::pair<size_t, const NamedTensor *>> restore;
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    const GlobalDesc &g = plan.globals[i];
    if (!isMutableRole(g.role)) continue;
    auto it = file.value().tensors.find(g.name);
    if (it == file.value().tensors.end()) return sdError("it has no tensor '", g.name, "' (was it made by another plan?)");
    const NamedTensor &t = it->second;
    if (t.dtype != g.dtype || t.dims != g.dims)
      return sdError("tensor '", g.name, "' is ", dtypeName(t.dtype), "[", formatDims(t.dims), "], the plan has ",
                     dtypeName(g.dtype), "[", formatDims(g.dims), "]");
    const Json *c = crcs->get(g.name);
    if (!c || !c->isInteger() || uint32_t(c->num) != crc32c(t.data, t.bytes))
      return sdError("tensor '", g.name, "' fails its checksum");
    restore.push_back({i, &t});
  }
  for (auto &[i, t] : restore) SD_RETURN_IF_ERROR(session.writeGlobal(i, t->data, t->bytes));
  meta.step = int64_t(step->num);
  meta.epoch = int64_t(epoch->num);
  meta.position = int64_t(pos->num);
  meta.seed = seedValue;
  return Status::ok();
}

StatusOr<CheckpointMeta> restoreLatestCheckpoint(const std::string &dir, Session &session, std::string &usedPath,
                                                 std::vector<std::string> &notes) {
  auto all = listCheckpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    CheckpointMeta meta;
    Status s = restoreFrom(it->second, session, meta);
    if (s.isOk()) {
      usedPath = it->second;
      return meta;
    }
    notes.push_back(it->second + " skipped: " + s.message());
  }
  return sdError(dir, ": no valid checkpoint to resume from");
}

} // namespace sd
