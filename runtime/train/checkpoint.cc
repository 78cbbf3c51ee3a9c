// Crash-safe, sharded training checkpoints with self-checking manifests.
#include "sd/train/checkpoint.h"
#include "checkpoint_manifest.h"
#include "sd/format/crc32c.h"
#include "sd/format/json.h"
#include "sd/format/safetensors.h"
#include "sd/train/ranks.h"
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <memory>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd {
namespace {

using checkpoint::kManifestFile;
using checkpoint::Manifest;
using checkpoint::Piece;

constexpr const char *kPrefix = "checkpoint-";
constexpr const char *kTempPrefix = ".tmp-checkpoint.";

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

int rankOf(const Communicator *comm) { return comm ? comm->rank() : 0; }
int worldOf(const Communicator *comm) { return comm ? comm->size() : 1; }

StatusOr<Manifest> readManifest(const std::string &folder) {
  auto text = readWholeFile(folder + "/" + kManifestFile);
  if (!text.isOk()) return sdError("no readable manifest (", text.status().message(), ")");
  return checkpoint::parseManifest(text.value(), folder + "/" + kManifestFile);
}

// A checkpoint of run `runId` at `step` whose manifest and state files verify.
bool verifiedCheckpoint(const std::string &folder, int64_t step, const std::string &runId) {
  auto m = readManifest(folder);
  if (!m.isOk() || m.value().meta.runId != runId || m.value().meta.step != step) return false;
  for (auto &[name, f] : m.value().files) {
    auto state = readWholeFile(folder + "/" + name);
    if (!state.isOk() || state.value().size() != f.bytes || crc32c(state.value().data(), state.value().size()) != f.crc)
      return false;
  }
  return true;
}

// The rows of a global a checkpoint stores per piece: a scalar is one row.
uint64_t rowBytesOf(const GlobalDesc &g) { return g.dims.empty() ? g.bytes : g.dims[0] ? g.bytes / uint64_t(g.dims[0]) : 0; }
int64_t rowsOf(const GlobalDesc &g) { return g.dims.empty() ? 1 : g.dims[0]; }

// What this rank writes: its rows of every global split by rows, the globals
// it holds alone (--shard optimizer|grads) and, on rank 0, those every rank
// holds. One safetensors file; its entry of the manifest comes back as JSON.
StatusOr<std::string> writeShard(const Session &session, const std::string &folder, int rank, int world) {
  const Plan &plan = session.plan();
  std::vector<std::pair<HostTensor, int64_t>> values; // value, first row
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    const GlobalDesc &g = plan.globals[i];
    if (!isTrainingStateRole(g.role)) continue;
    if (session.rowSharded(i)) {
      RowBlock b = session.globalRows(i);
      if (!b.count) continue; // more ranks than rows: this one keeps none
      HostTensor t{g.name, g.dtype, g.dims, {}};
      t.dims[0] = b.count;
      SD_RETURN_IF_ERROR(session.readGlobalRows(i, t.data));
      values.push_back({std::move(t), b.begin});
      continue;
    }
    const int owner = session.globalOwner(i);
    if (!session.holdsGlobal(i) || (owner < 0 && rank != 0)) continue;
    auto v = session.readGlobal(i);
    if (!v.isOk()) return v.status();
    values.push_back({std::move(v.value()), 0});
  }
  std::vector<NamedTensor> tensors;
  std::string pieces;
  for (auto &[v, first] : values) {
    tensors.push_back({v.name, v.dtype, v.dims, v.data.data(), v.byteSize()});
    const int64_t rows = v.dims.empty() ? 1 : v.dims[0];
    pieces += std::string(pieces.empty() ? "" : ",") + jsonQuote(v.name) + ":{\"first_row\":" + std::to_string(first) +
              ",\"rows\":" + std::to_string(rows) + ",\"crc32c\":" + std::to_string(crc32c(v.data.data(), v.byteSize())) + "}";
  }
  const std::string name = checkpoint::stateFileName(rank, world), path = folder + "/" + name;
  SD_RETURN_IF_ERROR(writeSafetensors(path, tensors));
  // The manifest records the file as written (read back, so a write the disk
  // garbled is caught now rather than at resume).
  auto written = readWholeFile(path);
  if (!written.isOk()) return written.status();
  const std::string &w = written.value();
  return "{\"file\":" + jsonQuote(name) + ",\"bytes\":" + std::to_string(w.size()) +
         ",\"crc32c\":" + std::to_string(crc32c(w.data(), w.size())) + ",\"pieces\":{" + pieces + "}}";
}

// Every rank's entry (JSON from writeShard, or an error message) into one manifest.
StatusOr<Manifest> assembleManifest(const CheckpointMeta &meta, const std::vector<std::string> &entries,
                                    const std::vector<std::string> &errors) {
  Manifest m;
  m.meta = meta;
  m.worldSize = int(entries.size());
  for (size_t r = 0; r < entries.size(); ++r) {
    if (!errors[r].empty()) return sdError(entries.size() > 1 ? "rank " + std::to_string(r) + ": " : "", errors[r]);
    auto doc = parseJson(entries[r], "rank " + std::to_string(r) + "'s state file entry");
    if (!doc.isOk()) return doc.status();
    const Json &e = doc.value();
    const Json *file = e.get("file"), *bytes = e.get("bytes"), *crc = e.get("crc32c"), *pieces = e.get("pieces");
    if (!file || !bytes || !crc || !pieces) return sdError("rank ", r, " sent an incomplete state file entry");
    m.files[file->str] = {int(r), uint64_t(bytes->num), uint32_t(crc->num)};
    for (auto &[name, p] : pieces->obj)
      m.tensors[name].push_back(Piece{file->str, int64_t(p.get("first_row")->num), int64_t(p.get("rows")->num),
                                      uint32_t(p.get("crc32c")->num)});
  }
  return m;
}

// Reads, from the checkpoint at `path`, the value of every global this rank
// holds (its rows of those split by rows), whatever world size wrote it: the
// pieces that overlap those rows are copied in. Nothing touches the session.
using Staged = std::vector<std::pair<size_t, std::vector<uint8_t>>>;
Status stageFrom(const std::string &path, const Session &session, Staged &staged, CheckpointMeta &meta) {
  auto manifest = readManifest(path);
  if (!manifest.isOk()) return manifest.status();
  const Manifest &m = manifest.value();
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files; // read once each, on first use
  auto fileNamed = [&](const std::string &name) -> StatusOr<const SafetensorsFile *> {
    auto &slot = files[name];
    if (!slot) {
      auto f = readSafetensors(path + "/" + name);
      if (!f.isOk()) return f.status().withContext(name + ": ");
      const checkpoint::StateFile &want = m.files.at(name);
      if (f.value().bytes.size() != want.bytes || crc32c(f.value().bytes.data(), f.value().bytes.size()) != want.crc)
        return sdError(name, " fails its checksum");
      slot = std::make_unique<SafetensorsFile>(std::move(f.value()));
    }
    return slot.get();
  };
  const Plan &plan = session.plan();
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    const GlobalDesc &g = plan.globals[i];
    if (!isTrainingStateRole(g.role)) continue;
    auto listed = m.tensors.find(g.name);
    if (listed == m.tensors.end()) return sdError("it has no tensor '", g.name, "' (was it made by another plan?)");
    RowBlock need{0, rowsOf(g)};
    if (session.rowSharded(i)) need = session.globalRows(i);
    else if (!session.holdsGlobal(i)) continue; // another rank's: it reads it
    const uint64_t row = rowBytesOf(g);
    std::vector<uint8_t> value(row * uint64_t(need.count));
    int64_t covered = 0;
    for (const Piece &p : listed->second) {
      // Only the files with rows this rank needs are read.
      const int64_t rows = p.rows < 0 ? rowsOf(g) : p.rows;
      const int64_t from = std::max(need.begin, p.firstRow), to = std::min(need.begin + need.count, p.firstRow + rows);
      if (from >= to) continue;
      auto file = fileNamed(p.file);
      if (!file.isOk()) return file.status();
      auto t = file.value()->tensors.find(g.name);
      if (t == file.value()->tensors.end()) return sdError(p.file, " has no tensor '", g.name, "'");
      const NamedTensor &piece = t->second;
      const bool fits = piece.dtype == g.dtype && piece.dims.size() == g.dims.size() &&
                        (g.dims.empty() ? rows == 1 : piece.dims[0] == rows) &&
                        std::equal(piece.dims.begin() + (g.dims.empty() ? 0 : 1), piece.dims.end(),
                                   g.dims.begin() + (g.dims.empty() ? 0 : 1)) &&
                        p.firstRow + rows <= rowsOf(g) && piece.bytes == row * uint64_t(rows);
      if (!fits)
        return sdError("tensor '", g.name, "' is ", dtypeName(piece.dtype), "[", formatDims(piece.dims), "] from row ",
                       p.firstRow, " in ", p.file, ", the plan has ", dtypeName(g.dtype), "[", formatDims(g.dims), "]");
      if (crc32c(piece.data, piece.bytes) != p.crc) return sdError("tensor '", g.name, "' in ", p.file, " fails its checksum");
      std::memcpy(value.data() + row * uint64_t(from - need.begin),
                  static_cast<const uint8_t *>(piece.data) + row * uint64_t(from - p.firstRow), row * uint64_t(to - from));
      covered += to - from;
    }
    if (covered != need.count)
      return sdError("rows ", need.begin, "..", need.begin + need.count, " of '", g.name, "' are ",
                     covered < need.count ? "not all in its pieces" : "in overlapping pieces");
    staged.push_back({i, std::move(value)});
  }
  meta = m.meta;
  return Status::ok();
}

// The first rank's error of `errors`, named by rank when there are several ranks; empty when none failed.
std::string firstError(const std::vector<std::string> &errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) return (errors.size() > 1 ? "rank " + std::to_string(r) + ": " : "") + errors[r];
  return "";
}

} // namespace

StatusOr<CheckpointMeta> parseCheckpointManifest(const std::string &text, const std::string &what) {
  auto m = checkpoint::parseManifest(text, what);
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

StatusOr<CheckpointFolder> CheckpointFolder::open(const std::string &dir, const Communicator *comm) {
  CheckpointFolder f;
  f.dir_ = dir;
  if (rankOf(comm) != 0) return f;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return sdError(dir, ": cannot create checkpoint folder (", std::strerror(errno), ")");
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return sdError(dir, ": exists and is not a folder");
  auto lock = DirectoryLock::acquire(dir, "checkpoints");
  if (!lock.isOk()) return lock.status();
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

Status CheckpointFolder::save(const Session &session, const CheckpointMeta &meta, int keep) {
  Communicator *comm = session.communicator();
  const int rank = rankOf(comm), world = worldOf(comm);
  const std::string context = "checkpoint at step " + std::to_string(meta.step) + ": ";
  // Rank 0 makes the temp folder; its name carries rank 0's pid, so a killed
  // run's leftover is removed by the next run that opens the folder.
  int64_t pid = 0;
  Status made;
  if (rank == 0) {
    pid = ::getpid();
    std::string tmp = dir_ + "/" + kTempPrefix + std::to_string(pid);
    removeTree(tmp);
    if (::mkdir(tmp.c_str(), 0755) != 0) made = sdError(tmp, ": cannot create (", std::strerror(errno), ")"), pid = -1;
  }
  SD_RETURN_IF_ERROR(train::broadcastBytes(comm, &pid, sizeof pid).withContext(context));
  if (pid < 0) return rank == 0 ? made.withContext(context) : sdError(context, "rank 0 could not create its folder");
  const std::string tmp = dir_ + "/" + kTempPrefix + std::to_string(pid), final = dir_ + "/" + kPrefix + std::to_string(meta.step);
  // Every rank writes its own state file, and all learn how each went.
  auto entry = writeShard(session, tmp, rank, world);
  auto errors = train::allGatherStrings(comm, entry.isOk() ? "" : entry.status().message());
  if (!errors.isOk()) return errors.status().withContext(context);
  auto entries = train::allGatherStrings(comm, entry.isOk() ? entry.value() : "");
  if (!entries.isOk()) return entries.status().withContext(context);
  // Rank 0 commits the set: the manifest last, then one rename of the folder.
  Status s;
  if (rank == 0) {
    auto m = assembleManifest(meta, entries.value(), errors.value());
    if (!m.isOk()) s = m.status();
    if (s.isOk()) s = writeFileAtomic(tmp + "/" + kManifestFile, checkpoint::manifestText(m.value()));
    if (s.isOk()) s = syncDirectory(tmp);
    if (s.isOk()) s = replaceDirectory(tmp, final); // replaces a broken leftover of the same name atomically
    if (!s.isOk()) removeTree(tmp);
  }
  uint8_t committed = s.isOk();
  SD_RETURN_IF_ERROR(train::broadcastBytes(comm, &committed, 1).withContext(context));
  if (!s.isOk()) return s.withContext(context);
  if (!committed) {
    std::string why = firstError(errors.value());
    return sdError(context, why.empty() ? "rank 0 could not commit it" : why);
  }
  if (rank != 0) return Status::ok();
  // Prune: keep the newest `keep` verified checkpoints of this run; never
  // touch another run's folders or ones that do not verify. (Each is read
  // once per process: the verdict is cached by folder.)
  verified_[final] = true; // its state files were read back before the manifest was written
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
                                                         std::vector<std::string> &notes) const {
  Communicator *comm = session.communicator();
  const int rank = rankOf(comm);
  // Rank 0 names the candidates, newest first; every rank tries each one and
  // all take the first that verifies for every rank.
  auto all = rank == 0 ? listCheckpoints(dir_) : std::vector<std::pair<int64_t, std::string>>();
  int64_t count = int64_t(all.size());
  SD_RETURN_IF_ERROR(train::broadcastBytes(comm, &count, sizeof count).withContext("resume: "));
  for (int64_t k = count - 1; k >= 0; --k) {
    int64_t step = rank == 0 ? all[size_t(k)].first : 0;
    std::string path = rank == 0 ? all[size_t(k)].second : "";
    SD_RETURN_IF_ERROR(train::broadcastBytes(comm, &step, sizeof step).withContext("resume: "));
    SD_RETURN_IF_ERROR(train::broadcastString(comm, path).withContext("resume: "));
    Staged staged;
    CheckpointMeta meta;
    Status s = stageFrom(path, session, staged, meta);
    if (s.isOk() && meta.step != step) s = sdError("its manifest is for step ", meta.step, ", not ", step);
    auto errors = train::allGatherStrings(comm, s.isOk() ? "" : s.message());
    if (!errors.isOk()) return errors.status().withContext("resume: ");
    std::string why = firstError(errors.value());
    if (!why.empty()) {
      if (rank == 0) notes.push_back(path + " skipped: " + why);
      continue;
    }
    for (auto &[i, bytes] : staged) SD_RETURN_IF_ERROR(session.writeGlobalRows(i, bytes.data(), bytes.size()));
    usedPath = path;
    return meta;
  }
  return sdError(dir_, ": no valid checkpoint to resume from");
}

} // namespace sd
