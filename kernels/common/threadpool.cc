// Fixed-size thread pool; chunks are claimed under a mutex (jobs are coarse).
#include "sd/ops/threadpool.h"
#include <algorithm>

namespace sd {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i)
    workers_.emplace_back([this] { workerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto &t : workers_) t.join();
}

// Steps arrive back to back; a worker that polls briefly before sleeping picks
// up the next job without a futex wake (tens of microseconds on a VM).
constexpr int kSpinIterations = 20000;

void ThreadPool::workerLoop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (generation_.load(std::memory_order_acquire) == seen && !stop_) {
      lock.unlock();
      for (int i = 0; i < kSpinIterations && generation_.load(std::memory_order_acquire) == seen; ++i)
        __builtin_ia32_pause();
      lock.lock();
      sleeping_.fetch_add(1);
      wake_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
      sleeping_.fetch_sub(1);
    }
    if (stop_) return;
    seen = generation_.load();
    while (job_ && nextChunk_ < chunks_) {
      int64_t c = nextChunk_++;
      auto *job = job_;
      int64_t b = c * jobChunk_, e = std::min(jobN_, b + jobChunk_);
      lock.unlock();
      (*job)(b, e);
      lock.lock();
      if (finished_.fetch_add(1) + 1 == chunks_) done_.notify_all();
    }
  }
}

void ThreadPool::parallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)> &fn) {
  if (n <= 0) return;
  int64_t parts = std::min<int64_t>(size() * 4, (n + grain - 1) / std::max<int64_t>(grain, 1));
  if (parts <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  jobN_ = n;
  jobChunk_ = (n + parts - 1) / parts;
  chunks_ = (n + jobChunk_ - 1) / jobChunk_;
  nextChunk_ = 0;
  finished_ = 0;
  generation_.fetch_add(1, std::memory_order_release);
  if (sleeping_.load()) wake_.notify_all();
  while (nextChunk_ < chunks_) {
    int64_t c = nextChunk_++;
    int64_t b = c * jobChunk_, e = std::min(jobN_, b + jobChunk_);
    lock.unlock();
    fn(b, e);
    lock.lock();
    finished_.fetch_add(1);
  }
  // The workers' last chunks usually end within microseconds: poll before
  // sleeping, as the workers do, so that a decode step's many small products
  // do not each pay a futex wake.
  if (finished_.load() != chunks_) {
    lock.unlock();
    for (int i = 0; i < kSpinIterations && finished_.load(std::memory_order_acquire) != chunks_; ++i)
      __builtin_ia32_pause();
    lock.lock();
    done_.wait(lock, [&] { return finished_.load() == chunks_; });
  }
  job_ = nullptr;
}

void parallelFor(ThreadPool *pool, int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)> &fn) {
  if (pool) pool->parallelFor(n, grain, fn);
  else if (n > 0) fn(0, n);
}

} // namespace sd
