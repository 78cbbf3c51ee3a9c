// Files the tools read and write, under the rules of docs/reliability.md:
// reads are bounded by the file's size and refuse anything but regular files
// (a FIFO or /dev/zero is an error, never a hang or an unbounded read);
// writes go to a temp file that is fsynced and renamed into place, and a full
// disk or a file-size limit (EFBIG with SIGXFSZ ignored) is an error naming
// the file; temp files are removed on every error path, and those of killed
// processes are removed by the next writer of the same path.
#pragma once
#include "sd/format/status.h"
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sd {

// Opens a regular file for reading without blocking on FIFOs; returns the fd
// (close it) and its size.
StatusOr<int> openRegularFile(const std::string &path, size_t &size);
Status requireRegularFile(const std::string &path);
// A regular file mapped read-only (private), unmapped on destruction: plans,
// their external weights, and training arrays too large to read whole.
class MappedFile {
public:
  static StatusOr<std::unique_ptr<MappedFile>> open(const std::string &path);
  ~MappedFile();
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;
  const uint8_t *data = nullptr;
  size_t size = 0;

private:
  MappedFile() = default;
};
StatusOr<std::string> readWholeFile(const std::string &path);
// "<bytes> bytes, crc32c <hex>" of a file's contents, read in chunks: tells
// whether a resumed run reads the same data.
StatusOr<std::string> fileFingerprint(const std::string &path);

Status writeFileAtomic(const std::string &path, const std::string &bytes);
Status writeFileAtomic(const std::string &path, const std::vector<std::pair<const void *, size_t>> &pieces);
// Why a write failed, for messages ("no space left on the device", ...).
std::string writeErrorReason(int err);
// fsyncs a directory so a rename inside it is durable.
Status syncDirectory(const std::string &dir);
std::string parentDirectory(const std::string &path);
// Removes a folder and the files in it (our artifacts are flat folders).
void removeTree(const std::string &path);
// Temp names carry the writer's pid: "<base><pid>" or "<base><pid>-<tag>".
// Removes those in `dir` whose pid is no longer running.
void removeStaleTemps(const std::string &dir, const std::string &base);
// Puts the finished folder `staged` at `dir` in one atomic step: a rename when
// `dir` does not exist, else an exchange of the two (renameat2) and the old
// one removed. Readers see the old folder or the new one, never a mix.
Status replaceDirectory(const std::string &staged, const std::string &dir);

// Output checks made before any work starts, so a bad path does not cost a
// training run: the file's folder exists and is writable and the path is not
// a folder; a folder output is a folder or can be created.
Status checkOutputFile(const std::string &path, const std::string &flag);
Status checkOutputFolder(const std::string &path, const std::string &flag);

// An exclusive flock on DIR/.lock, held while a run writes into DIR.
class DirectoryLock {
public:
  static StatusOr<DirectoryLock> acquire(const std::string &dir, const std::string &what);
  DirectoryLock() = default;
  DirectoryLock(DirectoryLock &&o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  DirectoryLock &operator=(DirectoryLock &&o) noexcept;
  ~DirectoryLock();

private:
  int fd_ = -1;
};

// The tools' process setup: a file-size limit makes write() fail with EFBIG
// instead of killing the process with SIGXFSZ (Python does the same).
void ignoreFileSizeSignal();

} // namespace sd
