// Session::Impl, shared by the files that implement Session (session.cc:
// creation, steps, globals; session_runs.cc: runs from and to the host).
#pragma once
#include "host_fallback.h"
#include "sd/ops/kernel.h"
#include "sd/ops/threadpool.h"
#include "sd/runtime/session.h"
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sd {

struct Session::Impl {
  struct PreparedStep {
    const StepDesc *desc;
    const KernelDef *kernel;
    KernelContext ctx;
    // Every output is a global another rank holds (--shard grads: the
    // accumulation into a gradient this rank does not keep): not run here.
    bool elsewhere = false;
    // A CPU kernel that computes this step's f16/bf16 operands in f32: their
    // stand-ins, laid out once (see layOutHalves).
    std::optional<HalfOperands> half;
    // No kernel on the session's device: the CPU kernel runs on host copies
    // of the operands (host_fallback.h); ctx points at those copies.
    std::unique_ptr<HostCopies> onHost;
  };
  // Values the kernels' prepare functions derived (packed weights), shared
  // between steps; the steps' contexts point into them.
  std::map<std::string, std::shared_ptr<const void>> preparedShared;
  std::vector<std::shared_ptr<const void>> preparedSteps;
  // The f32 stand-ins of half operands (HalfOperands): a constant one widened
  // once, keyed by its address, so a weight several steps read is widened
  // once; the others share one scratch block, as steps run one at a time.
  struct Widened {
    std::unique_ptr<float[]> data;
    uint64_t bytes = 0;
  };
  std::map<const void *, Widened> widenedConstants; // by the half weight's address
  std::unique_ptr<float[]> halfScratch;
  uint64_t halfBytes = 0;
  StatusOr<int64_t> layOutHalves(PreparedStep &ps, const std::vector<bool> &constant);
  void releaseUnreadWidenings();
  struct PreparedEntry {
    std::vector<TensorView> views; // one per buffer
    std::vector<PreparedStep> steps;
    // Graph replay, per segment: the entry's steps split at each step the
    // host must run itself (a Loop or If step decides on the host what runs;
    // a step falling back to the CPU waits for the device). Each run of
    // other steps runs eagerly once (warm-up), is then captured and replayed.
    struct Segment {
      size_t begin = 0, end = 0; // steps [begin, end)
      bool onHost = false;       // one step the host runs, never captured
      std::shared_ptr<void> graph;
      int eagerRuns = 0;
      bool captureFailed = false;
    };
    std::vector<Segment> segments;
    // A device the host cannot address: a run's inputs and outputs pass
    // through a staging block (page-locked on a GPU), so a run queues its
    // copies and the host waits once. stagedAt: each input's, then each
    // output's, then each counted output's count's offset in the block,
    // laid out at the entry's first run; stagedBytes: their total.
    std::vector<size_t> stagedAt;
    size_t stagedBytes = 0;
  };
  std::shared_ptr<Device> device;
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<ThreadPool> pool;
  uint8_t *arena = nullptr;
  // All mutable globals in one 64-byte-aligned block, in plan order, so the
  // gradients (created together by the compiler) are one contiguous range.
  uint8_t *state = nullptr;
  std::vector<uint8_t *> globalData; // null for a global another rank holds
  std::vector<int> globalOwner;       // -1: every rank holds it
  std::vector<bool> rowSharded;       // --shard params: held as rows (globalData points at this rank's)
  std::vector<RowBlock> rows;         // this rank's rows of each row-sharded global
  std::vector<PreparedEntry> entries;
  std::map<std::string, size_t> stepsOnHost; // op -> steps that fall back to the CPU
  bool profiling = false;
  bool graphs = true;
  std::chrono::steady_clock::time_point profileStart;
  std::vector<Session::TraceEvent> trace;
  size_t droppedTrace = 0;
  std::map<std::string, Session::OpProfile> profile;
  // Frozen globals copied to a device the host cannot address.
  std::vector<uint8_t *> uploaded;
  // Runs launched and not yet collected, oldest first (Session::launch).
  struct StagingBlock {
    uint8_t *data = nullptr;
    size_t bytes = 0;
  };
  struct QueuedRun {
    size_t entry = 0;
    StagingBlock block;              // staged devices: where the outputs arrive
    std::vector<size_t> alsoRead;    // globals copied after the run
    std::shared_ptr<void> started;   // before its input copies (timing)
    std::shared_ptr<void> fence;     // passed when the run's copies are done
    std::vector<HostTensor> outputs; // host-addressable devices: read at launch
  };
  std::deque<QueuedRun> queued;
  std::vector<StagingBlock> spareStaging; // blocks no queued run holds
  // Session::deviceTime: the first timed run's start fence since the reset.
  std::shared_ptr<void> timedFrom;
  Session::DeviceTime timed;
  bool timesRuns = true; // until the device says it does not
  StatusOr<StagingBlock> takeStaging(size_t bytes);
  ~Impl() {
    if (!device) return;
    if (!queued.empty()) (void)device->synchronize(); // no copy may land in freed memory
    for (QueuedRun &r : queued) device->releaseStaging(r.block.data);
    for (StagingBlock &b : spareStaging) device->releaseStaging(b.data);
    device->release(arena);
    device->release(state);
    for (uint8_t *p : uploaded) device->release(p);
  }
};

} // namespace sd
