// Bounded reads, atomic writes, stale temp cleanup, directory locks.
#include "sd/format/file_io.h"
#include "sd/format/crc32c.h"
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd {

StatusOr<int> openRegularFile(const std::string &path, size_t &size) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return sdError(path, ": cannot open (", std::strerror(errno), ")");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return sdError(path, ": not a regular file");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  size = size_t(st.st_size);
  return fd;
}

Status requireRegularFile(const std::string &path) {
  size_t size;
  auto fd = openRegularFile(path, size);
  if (!fd.isOk()) return fd.status();
  ::close(fd.value());
  return Status::ok();
}

StatusOr<std::string> readWholeFile(const std::string &path) {
  size_t size;
  auto fd = openRegularFile(path, size);
  if (!fd.isOk()) return fd.status();
  std::string out;
  try {
    out.resize(size);
  } catch (const std::bad_alloc &) {
    ::close(fd.value());
    return sdError(path, ": not enough memory to read its ", size, " bytes");
  }
  size_t off = 0;
  while (off < size) {
    ssize_t n = ::read(fd.value(), out.data() + off, size - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += size_t(n);
  }
  ::close(fd.value());
  if (off != size) return sdError(path, ": read error (the file shrank or could not be read)");
  return out;
}

StatusOr<std::unique_ptr<MappedFile>> MappedFile::open(const std::string &path) {
  size_t size = 0;
  auto opened = openRegularFile(path, size); // a FIFO would block in open(), /dev/zero never end
  if (!opened.isOk()) return opened.status();
  const int fd = opened.value();
  auto m = std::unique_ptr<MappedFile>(new MappedFile());
  m->size = size;
  if (m->size > 0) {
    void *p = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return sdError(path, ": cannot map (", std::strerror(err), ")");
    }
    m->data = static_cast<const uint8_t *>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data) munmap(const_cast<uint8_t *>(data), size);
}

StatusOr<std::string> fileFingerprint(const std::string &path) {
  size_t size;
  auto fd = openRegularFile(path, size);
  if (!fd.isOk()) return fd.status();
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  size_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd.value(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd.value());
      return sdError(path, ": read error (", std::strerror(errno), ")");
    }
    if (n == 0) break;
    crc = crc32c(buf.data(), size_t(n), crc);
    total += size_t(n);
  }
  ::close(fd.value());
  char out[64];
  std::snprintf(out, sizeof out, "%zu bytes, crc32c %08x", total, crc);
  return std::string(out);
}

std::string parentDirectory(const std::string &path) {
  size_t s = path.find_last_of('/');
  return s == std::string::npos ? "." : s == 0 ? "/" : path.substr(0, s);
}

static std::string baseName(const std::string &path) {
  size_t s = path.find_last_of('/');
  return s == std::string::npos ? path : path.substr(s + 1);
}

// A zombie (killed, not yet reaped by its parent: an mpirun rank just after
// the job ended) counts as dead: its temp files are nobody's.
static bool processAlive(long pid) {
  if (pid <= 0 || (::kill(pid_t(pid), 0) != 0 && errno != EPERM)) return false;
  std::string stat;
  if (FILE *f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r")) {
    char buf[512];
    stat.assign(buf, std::fread(buf, 1, sizeof buf, f));
    std::fclose(f);
  }
  size_t close = stat.rfind(')'); // "pid (comm) S ...": comm may hold spaces and parentheses
  return close == std::string::npos || close + 2 >= stat.size() || (stat[close + 2] != 'Z' && stat[close + 2] != 'X');
}

void removeTree(const std::string &path) {
  if (DIR *d = ::opendir(path.c_str())) {
    while (dirent *e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") ::unlink((path + "/" + n).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

void removeStaleTemps(const std::string &dir, const std::string &base) {
  DIR *d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent *e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.size() <= base.size() || n.compare(0, base.size(), base) != 0) continue;
    // "<base><pid>" or "<base><pid>-<anything>"
    std::string rest = n.substr(base.size());
    size_t digits = rest.find_first_not_of("0123456789");
    std::string pid = rest.substr(0, digits);
    if (pid.empty() || pid.size() > 9 || (digits != std::string::npos && rest[digits] != '-')) continue;
    if (!processAlive(std::atol(pid.c_str()))) stale.push_back(dir + "/" + n);
  }
  ::closedir(d);
  for (const std::string &p : stale) {
    struct stat st;
    if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) removeTree(p);
    else ::unlink(p.c_str());
  }
}

std::string writeErrorReason(int err) {
  if (err == EFBIG) return "the file-size limit was reached (ulimit -f)";
  if (err == ENOSPC) return "no space left on the device";
  return std::strerror(err);
}

static Status writeError(const std::string &path, int err) {
  return sdError(path, ": write failed: ", writeErrorReason(err));
}

Status writeFileAtomic(const std::string &path, const std::string &bytes) {
  return writeFileAtomic(path, {{bytes.data(), bytes.size()}});
}

Status writeFileAtomic(const std::string &path, const std::vector<std::pair<const void *, size_t>> &pieces) {
  std::string tempBase = baseName(path) + ".tmp.";
  removeStaleTemps(parentDirectory(path), tempBase);
  std::string tmp = parentDirectory(path) + "/" + tempBase + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return sdError(path, ": cannot write (", std::strerror(errno), ")");
  auto failWith = [&](int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return writeError(path, err);
  };
  for (auto [data, size] : pieces) {
    size_t off = 0;
    while (off < size) {
      ssize_t w = ::write(fd, static_cast<const char *>(data) + off, size - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return failWith(w < 0 ? errno : ENOSPC);
      off += size_t(w);
    }
  }
  if (::fsync(fd) != 0) return failWith(errno);
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return writeError(path, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return sdError(path, ": cannot rename into place (", std::strerror(err), ")");
  }
  return Status::ok();
}

Status syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sdError(dir, ": cannot open folder to sync");
  int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? Status::ok() : sdError(dir, ": fsync failed");
}

Status replaceDirectory(const std::string &staged, const std::string &dir) {
  // Another writer can create or replace `dir` between the check and the
  // rename (two trainings saving one adapter folder): a rename that finds the
  // folder there swaps instead, a swap that finds it gone moves instead.
  for (int attempt = 0;; ++attempt) {
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0) {
      if (::rename(staged.c_str(), dir.c_str()) == 0) break;
      if ((errno == EEXIST || errno == ENOTEMPTY) && attempt < 8) continue;
      return sdError(dir, ": cannot move the new folder into place (", std::strerror(errno), ")");
    }
    if (!S_ISDIR(st.st_mode)) return sdError(dir, ": exists and is not a folder");
    if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
      removeTree(staged); // now the old folder
      break;
    }
    if (errno == ENOENT && attempt < 8) continue;
    return sdError(dir, ": cannot swap the new folder into place (", std::strerror(errno), ")");
  }
  return syncDirectory(parentDirectory(dir));
}

Status checkOutputFile(const std::string &path, const std::string &flag) {
  if (path.empty()) return Status::ok();
  std::string dir = parentDirectory(path);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return sdError(flag, " ", path, ": folder '", dir, "' does not exist");
  if (::access(dir.c_str(), W_OK) != 0) return sdError(flag, " ", path, ": folder '", dir, "' is not writable");
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return sdError(flag, " ", path, ": is a folder");
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return sdError(flag, " ", path, ": is not a regular file");
  return Status::ok();
}

Status checkOutputFolder(const std::string &path, const std::string &flag) {
  if (path.empty()) return Status::ok();
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return sdError(flag, " ", path, ": exists and is not a folder");
    if (::access(path.c_str(), W_OK) != 0) return sdError(flag, " ", path, ": is not writable");
    return Status::ok();
  }
  std::string dir = parentDirectory(path);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return sdError(flag, " ", path, ": folder '", dir, "' does not exist");
  if (::access(dir.c_str(), W_OK) != 0) return sdError(flag, " ", path, ": folder '", dir, "' is not writable");
  return Status::ok();
}

StatusOr<DirectoryLock> DirectoryLock::acquire(const std::string &dir, const std::string &what) {
  std::string path = dir + "/.lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return sdError(dir, ": cannot create its lock file (", std::strerror(errno), ")");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    std::string holder = n > 0 ? std::string(buf, size_t(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return sdError(dir, ": another process", holder.empty() ? "" : " (pid " + holder + ")", " is writing ", what,
                   " here; wait for it or choose another folder");
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // The pid is only for the message a second writer gets; the lock holds.
  }
  DirectoryLock lock;
  lock.fd_ = fd;
  return lock;
}

DirectoryLock &DirectoryLock::operator=(DirectoryLock &&o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_); // closing releases the flock
}

void ignoreFileSizeSignal() { std::signal(SIGXFSZ, SIG_IGN); }

} // namespace sd
