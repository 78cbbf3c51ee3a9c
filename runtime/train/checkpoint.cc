// Crash-safe training checkpoints with self-checking manifests.
#include "sd/train/checkpoint.h"
#include "sd/format/crc32c.h"
#include "sd/format/json.h"
#include "sd/format/safetensors.h"
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd {
namespace {

constexpr const char *kPrefix = "checkpoint-";
constexpr const char *kTempPrefix = ".tmp-checkpoint.";
constexpr const char *kStateFile = "state.safetensors";
constexpr const char *kManifestFile = "manifest.json";
constexpr const char *kSelfCrcKey = ",\"manifest_crc32c\":";
constexpr int kVersion = 2;

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

std::string manifestText(const CheckpointMeta &meta, uint64_t stateBytes, uint32_t stateCrc, const std::string &crcs) {
  std::string run;
  for (auto &[k, v] : meta.run) run += (run.empty() ? "" : ",") + jsonQuote(k) + ":" + jsonQuote(v);
  std::string body = "{\"format\":\"sdc-checkpoint\",\"version\":" + std::to_string(kVersion) +
                     ",\"run\":" + jsonQuote(meta.runId) + ",\"step\":" + std::to_string(meta.step) +
                     ",\"total_steps\":" + std::to_string(meta.totalSteps) + ",\"epoch\":" + std::to_string(meta.epoch) +
                     ",\"position\":" + std::to_string(meta.position) + ",\"run_config\":{" + run + "}" +
                     ",\"files\":{" + jsonQuote(kStateFile) + ":{\"bytes\":" + std::to_string(stateBytes) +
                     ",\"crc32c\":" + std::to_string(stateCrc) + "}},\"tensors_crc32c\":{" + crcs + "}";
  return body + kSelfCrcKey + std::to_string(crc32c(body.data(), body.size())) + "}\n";
}

// A manifest that verifies (its own checksum, then every field in range).
struct Manifest {
  CheckpointMeta meta;
  uint64_t stateBytes = 0;
  uint32_t stateCrc = 0;
  Json tensorCrcs;
};

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
    if (!v || !v->isInteger() || v->num < 0) return false;
    out = int64_t(v->num);
    return true;
  };
  Manifest r;
  const Json *fmt = m.get("format"), *ver = m.get("version"), *run = m.get("run"), *cfg = m.get("run_config"),
             *files = m.get("files"), *crcs = m.get("tensors_crc32c");
  const Json *state = files ? files->get(kStateFile) : nullptr;
  const Json *bytes = state ? state->get("bytes") : nullptr, *crc = state ? state->get("crc32c") : nullptr;
  if (!fmt || fmt->str != "sdc-checkpoint" || !ver || !ver->isInteger() || ver->num != kVersion || !run ||
      run->type != Json::Type::String || !cfg || cfg->type != Json::Type::Object || !crcs ||
      crcs->type != Json::Type::Object || !bytes || !bytes->isInteger() || bytes->num < 0 || !crc || !crc->isInteger() || crc->num < 0 || crc->num > 4294967295.0 ||
      !integer("step", r.meta.step) || !integer("total_steps", r.meta.totalSteps) ||
      !integer("epoch", r.meta.epoch) || !integer("position", r.meta.position) || r.meta.step > r.meta.totalSteps)
    return sdError("malformed manifest");
  r.meta.runId = run->str;
  for (auto &[k, v] : cfg->obj) r.meta.run[k] = v.str;
  r.stateBytes = uint64_t(bytes->num);
  r.stateCrc = uint32_t(crc->num);
  r.tensorCrcs = *crcs;
  return r;
}

StatusOr<Manifest> readManifest(const std::string &folder) {
  auto text = readWholeFile(folder + "/" + kManifestFile);
  if (!text.isOk()) return sdError("no readable manifest (", text.status().message(), ")");
  return parseManifest(text.value(), folder + "/" + kManifestFile);
}

// A checkpoint of run `runId` at `step` whose manifest and state file verify.
bool verifiedCheckpoint(const std::string &folder, int64_t step, const std::string &runId) {
  auto m = readManifest(folder);
  if (!m.isOk() || m.value().meta.runId != runId || m.value().meta.step != step) return false;
  auto state = readWholeFile(folder + "/" + kStateFile);
  return state.isOk() && state.value().size() == m.value().stateBytes &&
         crc32c(state.value().data(), state.value().size()) == m.value().stateCrc;
}

Status restoreFrom(const std::string &path, Session &session, CheckpointMeta &meta, GlobalValues *heldElsewhere) {
  auto manifest = readManifest(path);
  if (!manifest.isOk()) return manifest.status();
  const Manifest &m = manifest.value();
  auto file = readSafetensors(path + "/" + kStateFile);
  if (!file.isOk()) return file.status();
  if (file.value().bytes.size() != m.stateBytes ||
      crc32c(file.value().bytes.data(), file.value().bytes.size()) != m.stateCrc)
    return sdError(kStateFile, " fails its checksum");
  const Plan &plan = session.plan();
  // Verify everything before touching the session.
  std::vector<std::pair<size_t, const NamedTensor *>> restore;
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    const GlobalDesc &g = plan.globals[i];
    if (!isTrainingStateRole(g.role)) continue;
    auto it = file.value().tensors.find(g.name);
    if (it == file.value().tensors.end()) return sdError("it has no tensor '", g.name, "' (was it made by another plan?)");
    const NamedTensor &t = it->second;
    if (t.dtype != g.dtype || t.dims != g.dims)
      return sdError("tensor '", g.name, "' is ", dtypeName(t.dtype), "[", formatDims(t.dims), "], the plan has ",
                     dtypeName(g.dtype), "[", formatDims(g.dims), "]");
    const Json *c = m.tensorCrcs.get(g.name);
    if (!c || !c->isInteger() || c->num < 0 || c->num > 4294967295.0 || uint32_t(c->num) != crc32c(t.data, t.bytes))
      return sdError("tensor '", g.name, "' fails its checksum");
    restore.push_back({i, &t});
  }
  for (auto &[i, t] : restore) {
    if (session.holdsGlobal(i)) SD_RETURN_IF_ERROR(session.writeGlobal(i, t->data, t->bytes));
    else if (heldElsewhere) {
      const uint8_t *bytes = static_cast<const uint8_t *>(t->data);
      (*heldElsewhere)[i].assign(bytes, bytes + t->bytes);
    }
    else return sdError("global '", plan.globals[i].name, "' is held by another rank and nobody takes its value");
  }
  meta = m.meta;
  return Status::ok();
}

} // namespace

StatusOr<CheckpointMeta> parseCheckpointManifest(const std::string &text, const std::string &what) {
  auto m = parseManifest(text, what);
  if (!m.isOk()) return m.status();
  return m.value().meta;
}

std::string newRunId() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != ssize_t(sizeof v))
    v = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^ (uint64_t(::getpid()) << 32);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

StatusOr<CheckpointFolder> CheckpointFolder::open(const std::string &dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return sdError(dir, ": cannot create checkpoint folder (", std::strerror(errno), ")");
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return sdError(dir, ": exists and is not a folder");
  auto lock = DirectoryLock::acquire(dir, "checkpoints");
  if (!lock.isOk()) return lock.status();
  CheckpointFolder f;
  f.dir_ = dir;
  f.lock_ = std::move(lock.value());
  removeStaleTemps(dir, kTempPrefix);
  return f;
}

Status CheckpointFolder::requireNoCheckpoints() const {
  auto all = listCheckpoints(dir_);
  if (all.empty()) return Status::ok();
  auto m = readManifest(all.back().second);
  std::string which = m.isOk() ? " (run " + m.value().meta.runId + ", step " + std::to_string(m.value().meta.step) +
                                     " of " + std::to_string(m.value().meta.totalSteps) + ")"
                               : "";
  return sdError(dir_, " already holds ", all.size(), " checkpoint(s), the newest ", all.back().second, which,
                 "; pass --resume to continue that run, or choose an empty checkpoint folder");
}

Status CheckpointFolder::save(const Session &session, const CheckpointMeta &meta, int keep,
                              const GlobalValues *heldElsewhere) {
  std::string name = kPrefix + std::to_string(meta.step);
  std::string tmp = dir_ + "/" + kTempPrefix + std::to_string(::getpid()), final = dir_ + "/" + name;
  removeTree(tmp);
  if (::mkdir(tmp.c_str(), 0755) != 0) return sdError(tmp, ": cannot create (", std::strerror(errno), ")");
  std::vector<HostTensor> values;
  std::vector<NamedTensor> tensors;
  std::string crcs;
  const Plan &plan = session.plan();
  Status s;
  for (size_t i = 0; i < plan.globals.size() && s.isOk(); ++i) {
    if (!isTrainingStateRole(plan.globals[i].role)) continue;
    if (!session.holdsGlobal(i)) { // another rank's shard, gathered by the caller
      auto it = heldElsewhere ? heldElsewhere->find(i) : GlobalValues::const_iterator();
      if (!heldElsewhere || it == heldElsewhere->end()) {
        s = sdError("global '", plan.globals[i].name, "' is held by rank ", session.globalOwner(i), " and was not gathered");
        break;
      }
      const GlobalDesc &g = plan.globals[i];
      values.push_back(HostTensor{g.name, g.dtype, g.dims, it->second});
      continue;
    }
    auto v = session.readGlobal(i);
    if (!v.isOk()) s = v.status();
    else values.push_back(std::move(v.value()));
  }
  for (const HostTensor &v : values) {
    tensors.push_back({v.name, v.dtype, v.dims, v.data.data(), v.byteSize()});
    crcs += std::string(crcs.empty() ? "" : ",") + jsonQuote(v.name) + ":" + std::to_string(crc32c(v.data.data(), v.byteSize()));
  }
  if (s.isOk()) s = writeSafetensors(tmp + "/" + kStateFile, tensors);
  // The manifest records the state file as written (read back, so a write the
  // disk garbled is caught now rather than at resume).
  StatusOr<std::string> written = s.isOk() ? readWholeFile(tmp + "/" + kStateFile) : StatusOr<std::string>(s);
  if (!written.isOk()) s = written.status();
  if (s.isOk()) {
    const std::string &w = written.value();
    s = writeFileAtomic(tmp + "/" + kManifestFile, manifestText(meta, w.size(), crc32c(w.data(), w.size()), crcs));
  }
  if (s.isOk()) s = syncDirectory(tmp);
  if (s.isOk()) s = replaceDirectory(tmp, final); // replaces a broken leftover of the same name atomically
  if (!s.isOk()) {
    removeTree(tmp);
    return s.withContext("checkpoint at step " + std::to_string(meta.step) + ": ");
  }
  // Prune: keep the newest `keep` verified checkpoints of this run; never
  // touch another run's folders or ones that do not verify. (Each is read
  // once per process: the verdict is cached by folder.)
  verified_[final] = true; // its state was read back before the manifest was written
  std::vector<std::string> ours;
  for (auto &[step, path] : listCheckpoints(dir_)) {
    auto known = verified_.find(path);
    bool good = known != verified_.end() ? known->second : (verified_[path] = verifiedCheckpoint(path, step, meta.runId));
    if (good) ours.push_back(path);
  }
  for (size_t i = 0; i + size_t(std::max(keep, 1)) < ours.size(); ++i) {
    // Renamed out of the way first: a kill while deleting leaves a temp
    // folder the next run removes, not a half-deleted checkpoint.
    std::string doomed = dir_ + "/" + kTempPrefix + std::to_string(::getpid()) + "-pruned";
    if (std::rename(ours[i].c_str(), doomed.c_str()) == 0) removeTree(doomed);
    verified_.erase(ours[i]);
  }
  return syncDirectory(dir_);
}

StatusOr<CheckpointMeta> CheckpointFolder::restoreLatest(Session &session, std::string &usedPath,
                                                         std::vector<std::string> &notes,
                                                         GlobalValues *heldElsewhere) const {
  auto all = listCheckpoints(dir_);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    CheckpointMeta meta;
    if (heldElsewhere) heldElsewhere->clear();
    Status s = restoreFrom(it->second, session, meta, heldElsewhere);
    if (s.isOk() && meta.step != it->first)
      s = sdError("its manifest is for step ", meta.step, ", not ", it->first);
    if (s.isOk()) {
      usedPath = it->second;
      return meta;
    }
    notes.push_back(it->second + " skipped: " + s.message());
  }
  return sdError(dir_, ": no valid checkpoint to resume from");
}

} // namespace sd
