// A small fixed-size thread pool with a blocking parallelFor, used by kernels
// that pay for threading. One pool per session, sized by --threads.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sd {

class ThreadPool {
public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  int size() const { return int(workers_.size()) + 1; }
  // Splits [0, n) into contiguous chunks of at least `grain` items and runs
  // fn(begin, end) on them, the calling thread included. Blocks until done.
  void parallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)> &fn);

private:
  void workerLoop();
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)> *job_ = nullptr;
  int64_t jobN_ = 0, jobChunk_ = 0, nextChunk_ = 0, chunks_ = 0;
  // Chunks done: written under mu_, read without it while the caller spins.
  std::atomic<int64_t> finished_{0};
  // Bumped under mu_ for each job; read without the lock while workers spin.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleeping_{0};
  bool stop_ = false;
};

// parallelFor that degrades to a plain loop without a pool.
void parallelFor(ThreadPool *pool, int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)> &fn);

} // namespace sd
