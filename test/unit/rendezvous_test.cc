// The torchrun-style rendezvous over real sockets, ranks as forked processes.
#include "sd/comm/rendezvous.h"
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace {

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

sd::Rendezvous at(int port, int rank, int size, double timeout = 20) {
  sd::Rendezvous r;
  r.host = "127.0.0.1";
  r.port = port;
  r.rank = rank;
  r.size = size;
  r.timeoutSeconds = timeout;
  return r;
}

// Forks one process per rank in `ranks`; each exits 0 when it got `expect`.
std::vector<pid_t> spawn(int port, int size, const std::vector<int> &ranks, const std::string &expect, int delayMs = 0) {
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
      auto got = sd::shareFromRankZero(at(port, rank, size), rank == 0 ? expect : "");
      ::_exit(got.isOk() && got.value() == expect ? 0 : 1);
    }
    pids.push_back(pid);
  }
  return pids;
}

bool allSucceeded(const std::vector<pid_t> &pids) {
  bool ok = true;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

TEST(Rendezvous, EveryRankGetsRankZerosBytes) {
  const std::string id(128, '\x7f');
  const int port = freePort();
  auto others = spawn(port, 4, {1, 2, 3}, id);
  auto mine = sd::shareFromRankZero(at(port, 0, 4), id);
  ASSERT_TRUE(mine.isOk()) << mine.status().message();
  EXPECT_EQ(mine.value(), id);
  EXPECT_TRUE(allSucceeded(others));
}

TEST(Rendezvous, RankZeroMayStartLast) {
  const std::string id = "nccl-unique-id";
  const int port = freePort();
  auto zero = spawn(port, 3, {0}, id, 700);
  auto others = spawn(port, 3, {1, 2}, id);
  EXPECT_TRUE(allSucceeded(others));
  EXPECT_TRUE(allSucceeded(zero));
}

TEST(Rendezvous, AMissingRankIsNamedAfterTheTimeout) {
  const int port = freePort();
  auto one = spawn(port, 3, {1}, "x");
  auto r = sd::shareFromRankZero(at(port, 0, 3, 1.5), "x");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("rank(s) 2 did not arrive within 1.5 s"), std::string::npos) << r.status().message();
  EXPECT_TRUE(allSucceeded(one));
}

TEST(Rendezvous, NoRankZeroIsAnErrorNotAHang) {
  auto r = sd::shareFromRankZero(at(freePort(), 1, 2, 0.5), "");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("no answer from rank 0"), std::string::npos) << r.status().message();
}

TEST(Rendezvous, AnotherWorldSizeIsRefused) {
  const int port = freePort();
  pid_t pid = ::fork();
  if (pid == 0) {
    auto got = sd::shareFromRankZero(at(port, 1, 3, 5), "");
    ::_exit(got.isOk() ? 0 : 1);
  }
  auto r = sd::shareFromRankZero(at(port, 0, 2, 5), "id");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("launched with WORLD_SIZE 3, rank 0 with 2"), std::string::npos)
      << r.status().message();
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_NE(WEXITSTATUS(status), 0); // rank 0 closed on it
}

TEST(Rendezvous, BadArgumentsAreErrors) {
  EXPECT_FALSE(sd::shareFromRankZero(at(0, 0, 2), "").isOk());
  EXPECT_FALSE(sd::shareFromRankZero(at(29500, 2, 2), "").isOk());
  EXPECT_TRUE(sd::shareFromRankZero(at(29500, 0, 1), "alone").isOk());
}

} // namespace

#include "sd/comm/world.h"
#include <cstdlib>

namespace {

// The NCCL world of one, torchrun-style: the plugin loads, rank 0 makes an
// id, and the communicator opens on a GPU, or, without one, the error says so.
TEST(NcclWorld, OpensOnAGpuOrSaysWhyNot) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("MASTER_PORT", std::to_string(freePort()).c_str(), 1);
  sd::WorldOptions o;
  o.cudaDevices = true;
  o.commTimeoutSeconds = 10;
  auto w = sd::openWorld(o);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  if (w.isOk()) {
    ASSERT_TRUE(w.value());
    EXPECT_EQ(w.value()->size(), 1);
    EXPECT_NE(w.value()->onStreams(), nullptr);
    EXPECT_NE(w.value()->describe().find("NCCL"), std::string::npos);
    return;
  }
  const std::string m = w.status().message();
#ifdef SD_TEST_NCCL_PLUGIN_BUILT
  // Built with NCCL: without a GPU the plugin loads and reports the missing GPU.
  EXPECT_TRUE(m.find("no CUDA GPU") != std::string::npos || m.find("ncclGetUniqueId") != std::string::npos) << m;
#else
  EXPECT_NE(m.find("NCCL plugin"), std::string::npos) << m;
#endif
}

} // namespace
