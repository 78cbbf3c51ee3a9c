// A small TCP rendezvous for torchrun-style launches: rank 0 listens, the
// others connect (retrying until rank 0 is up), say who they are, and get
// rank 0's payload. Every wait is bounded by the deadline.
#include "sd/comm/rendezvous.h"
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <set>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace sd {
namespace {

constexpr uint32_t kMagic = 0x76726473; // "sdrv"
constexpr uint64_t kMaxPayload = 1 << 20;
using Clock = std::chrono::steady_clock;

struct Socket {
  int fd = -1;
  explicit Socket(int f = -1) : fd(f) {}
  Socket(Socket &&o) noexcept : fd(o.fd) { o.fd = -1; }
  Socket &operator=(Socket &&o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

int msLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<int64_t>(left, 1 << 30));
}

// Waits for `events` on fd until the deadline; false on timeout or error.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, msLeft(deadline));
    if (n > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
    if (n == 0 || errno != EINTR) return false;
  }
}

bool sendAll(int fd, const void *data, size_t n, Clock::time_point deadline) {
  const char *p = static_cast<const char *>(data);
  while (n) {
    if (!waitFor(fd, POLLOUT, deadline)) return false;
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return false;
    p += w, n -= size_t(w);
  }
  return true;
}

bool recvAll(int fd, void *data, size_t n, Clock::time_point deadline) {
  char *p = static_cast<char *>(data);
  while (n) {
    if (!waitFor(fd, POLLIN, deadline)) return false;
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return false;
    p += r, n -= size_t(r);
  }
  return true;
}

std::string where(const Rendezvous &r) { return r.host + ":" + std::to_string(r.port); }

StatusOr<std::string> serve(const Rendezvous &r, const std::string &payload, Clock::time_point deadline) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (int e = ::getaddrinfo(nullptr, std::to_string(r.port).c_str(), &hints, &found); e != 0)
    return sdError("rendezvous: port ", r.port, ": ", gai_strerror(e));
  Socket listener;
  std::string why = "no address to listen on";
  for (addrinfo *a = found; a && listener.fd < 0; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    int one = 1;
    if (s.fd < 0 || ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        ::bind(s.fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(s.fd, 128) != 0) {
      why = std::strerror(errno);
      continue;
    }
    listener = std::move(s);
  }
  ::freeaddrinfo(found);
  if (listener.fd < 0) return sdError("rendezvous: rank 0 cannot listen on port ", r.port, " (", why, ")");
  std::set<uint32_t> arrived;
  while (int(arrived.size()) < r.size - 1) {
    if (!waitFor(listener.fd, POLLIN, deadline)) break;
    Socket peer(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (peer.fd < 0) continue;
    uint32_t hello[3];
    // Something else on the port (a scanner, a stray client) is dropped, not fatal.
    const auto helloDeadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    if (!recvAll(peer.fd, hello, sizeof hello, helloDeadline) || hello[0] != kMagic) continue;
    if (hello[2] != uint32_t(r.size))
      return sdError("rendezvous on ", where(r), ": rank ", hello[1], " was launched with WORLD_SIZE ", hello[2],
                     ", rank 0 with ", r.size);
    if (hello[1] == 0 || hello[1] >= uint32_t(r.size) || !arrived.insert(hello[1]).second)
      return sdError("rendezvous on ", where(r), ": two processes claim rank ", hello[1]);
    uint64_t size = payload.size();
    if (!sendAll(peer.fd, &size, sizeof size, deadline) || !sendAll(peer.fd, payload.data(), payload.size(), deadline))
      return sdError("rendezvous on ", where(r), ": rank ", hello[1], " left before it got the id");
  }
  if (int(arrived.size()) < r.size - 1) {
    std::string missing;
    for (int k = 1; k < r.size; ++k)
      if (!arrived.count(uint32_t(k))) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
    return sdError("rendezvous on ", where(r), ": rank(s) ", missing, " did not arrive within ", r.timeoutSeconds,
                   " s (--comm-timeout)");
  }
  return payload;
}

StatusOr<std::string> join(const Rendezvous &r, Clock::time_point deadline) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (int e = ::getaddrinfo(r.host.c_str(), std::to_string(r.port).c_str(), &hints, &found); e != 0)
    return sdError("rendezvous: MASTER_ADDR ", r.host, ": ", gai_strerror(e));
  std::string why = "rank 0 is not listening";
  Status result = sdError("rendezvous on ", where(r), ": no answer from rank 0 within ", r.timeoutSeconds, " s (", why, ")");
  // Rank 0 may start later than this rank: retry until the deadline.
  while (msLeft(deadline) > 0) {
    for (addrinfo *a = found; a; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (s.fd < 0) continue;
      if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) continue;
      int err = 0;
      socklen_t len = sizeof err;
      if (!waitFor(s.fd, POLLOUT, deadline) || ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) continue;
      uint32_t hello[3] = {kMagic, uint32_t(r.rank), uint32_t(r.size)};
      uint64_t size = 0;
      if (!sendAll(s.fd, hello, sizeof hello, deadline) || !recvAll(s.fd, &size, sizeof size, deadline)) {
        ::freeaddrinfo(found);
        return sdError("rendezvous on ", where(r), ": rank 0 closed the connection (see its error)");
      }
      std::string payload(size > kMaxPayload ? 0 : size_t(size), '\0');
      const bool ok = size <= kMaxPayload && recvAll(s.fd, payload.data(), payload.size(), deadline);
      ::freeaddrinfo(found);
      if (!ok) return sdError("rendezvous on ", where(r), ": rank 0 sent no valid id");
      return payload;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, msLeft(deadline))));
  }
  ::freeaddrinfo(found);
  return result;
}

} // namespace

StatusOr<std::string> shareFromRankZero(const Rendezvous &r, const std::string &payload) {
  if (r.size < 1 || r.rank < 0 || r.rank >= r.size) return sdError("rendezvous: rank ", r.rank, " of ", r.size);
  if (r.port <= 0 || r.port > 65535) return sdError("rendezvous: MASTER_PORT ", r.port, " is not a TCP port");
  if (payload.size() > kMaxPayload) return sdError("rendezvous: payload of ", payload.size(), " bytes");
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(r.timeoutSeconds * 1000));
  if (r.size == 1) return payload;
  return r.rank == 0 ? serve(r, payload, deadline) : join(r, deadline);
}

} // namespace sd
