// Session: runs a plan's entries on a device. The arena is allocated once,
// sized by the largest entry; every step is bound to a kernel of the device at
// creation, so a plan the device cannot run fails there, not mid-step.
#pragma once
#include "sd/runtime/device.h"
#include "sd/runtime/plan.h"
#include "sd/format/row_shard.h"
#include "sd/format/tensor_io.h"
#include "sd/ops/communicator.h"
#include <map>
#include <set>
#include <memory>
#include <vector>

namespace sd {

struct KernelDef;
struct KernelContext;

// The kernel of `kernels` that runs step `index` of entry `e`, or an error
// naming the entry, step, location, op and backend. Sessions bind every step
// through it; `sdrun inspect --kernels` reports a plan's coverage with it.
StatusOr<const KernelDef *> bindStep(const EntryDesc &e, size_t index, const KernelRegistry &kernels);
// bindStep on `kernels`, else, when `cpuFallback`, on the CPU's (`onCpu` then
// true): how a session on a GPU binds (SessionOptions::cpuFallback) and what
// `sdrun inspect --kernels` reports. An error is `kernels`' refusal. With
// `cpuFallback`, ops in `cpuOps` bind on the CPU first (SessionOptions::cpuOps).
StatusOr<const KernelDef *> bindStepOrCpu(const EntryDesc &e, size_t index, const KernelRegistry &kernels,
                                          bool cpuFallback, bool &onCpu, const std::set<std::string> &cpuOps = {});
// What bindStep gives a Loop or If step on every device (null for other
// ops): the session runs it (it runs other entries of the plan), not a kernel.
const KernelDef *bodyStepKernel(const std::string &op);

// The plan's sdc compile --shard mode: "none", "optimizer", "grads" or "params".
std::string shardMode(const Plan &plan);
// --shard params: which globals are held as rows split over the ranks
// (sd::rowBlock), as the plan config's row_sharded lists them; an unknown
// name is an error.
StatusOr<std::vector<bool>> rowShardedGlobals(const Plan &plan);
// Bytes of global `index` that rank `rank` of `ranks` keeps: all of it, none
// (another rank's shard), or its rows.
uint64_t globalBytesOnRank(const Plan &plan, size_t index, int rank, int ranks, const std::vector<int> &owner,
                           const std::vector<bool> &rowSharded);
// Which rank holds each global when the plan runs on `ranks` ranks: -1 for
// every rank; for plans compiled with --shard optimizer, each trainable
// parameter's optimizer state is held by its owner (largest parameter first,
// to the least loaded rank), and with --shard grads its gradient too. `paramOwner` (optional) gets each parameter's owner.
std::vector<int> globalHolders(const Plan &plan, int ranks, std::map<std::string, int> *paramOwner = nullptr);

struct SessionOptions {
  int threads = 0;               // 0: all hardware threads
  std::shared_ptr<Device> device; // null: the CPU
  // Where the device can (CUDA): each entry runs eagerly once, is then
  // captured into a graph and replayed after. false: every run is eager.
  bool graphs = true;
  // The world this session is one rank of (sd/comm/world.h); null: alone.
  std::shared_ptr<Communicator> comm;
  // On a device the host cannot address (a GPU): a step whose op has no
  // kernel there runs the CPU's on host copies of its operands (between the
  // captured graphs of the steps around it). false: such a plan is refused,
  // naming the step.
  bool cpuFallback = true;
  // Ops whose steps run the CPU's kernel, the same way, even where the device
  // has its own: to tell a device kernel's result from the rest of a plan
  // (sdrun --cpu-ops). Ignored on the CPU and without cpuFallback.
  std::set<std::string> cpuOps;
};

class Session {
public:
  static StatusOr<std::unique_ptr<Session>> create(std::shared_ptr<const Plan> plan,
                                                    const SessionOptions &opts = {});
  ~Session();
  const Plan &plan() const { return *plan_; }
  const Device &device() const;
  // The ranks this session trains with; null when it runs alone.
  Communicator *communicator() const;
  // Bytes the session holds on its device: arena, training state, (on a
  // device the host cannot address) the uploaded weights, and (on the CPU)
  // the f32 stand-ins of half operands (kernel.h, HalfOperands).
  uint64_t deviceBytes() const;
  // Runs entry `entry` on inputs given in the entry's input order; outputs come
  // back in output order. Input dtypes and shapes must match the bucket.
  // Refused while launched runs wait to be collected.
  Status run(size_t entry, const std::vector<const HostTensor *> &inputs, std::vector<HostTensor> &outputs);
  // run() in two halves, so the host can prepare the next run while the
  // device works: launch() checks and copies the inputs, queues the entry
  // and the copies of its outputs and of the globals in `alsoRead` (their
  // values right after this run), and returns; collect() waits for the
  // oldest launched run and gives its outputs, then those globals. On a GPU
  // launch() returns before the run is done; on the CPU, after (a later run
  // cannot change what collect() gives). Anything else (readGlobal,
  // writeGlobal, runOnDevice) acts after every launched run.
  Status launch(size_t entry, const std::vector<const HostTensor *> &inputs, const std::vector<size_t> &alsoRead = {});
  Status collect(std::vector<HostTensor> &outputs);
  size_t launchedRuns() const; // launched and not yet collected
  // On a device that times its work (a GPU), over the runs collected since
  // the last reset: the device time each took (its first input copy to its
  // last output copy), summed, and the time from the first one's start to
  // the last one's end. span - busy is time the device waited for the host
  // (between runs, or work outside them). nullopt on other devices.
  struct DeviceTime {
    double busyMs = 0, spanMs = 0;
    int64_t runs = 0;
    double idleMsPerRun() const { return runs ? (spanMs - busyMs) / double(runs) : 0; }
  };
  std::optional<DeviceTime> deviceTime() const;
  void resetDeviceTime();
  // The same with inputs and outputs already in the device's memory (from
  // device().allocate, or another session's buffers on the same device): no
  // host copies. Every tensor's dtype and dims must be the entry's, outputs
  // in the entry's output order. Entries whose outputs are counted at run
  // time (NonMaxSuppression, NonZero) need run(), which trims them. The
  // output copies are queued in order with the session's work: read them
  // elsewhere after synchronize().
  Status runOnDevice(size_t entry, const std::vector<TensorView> &inputs, const std::vector<TensorView> &outputs);
  Status synchronize();
  // Steps that run on the CPU because the device has no kernel for them, by
  // op (SessionOptions::cpuFallback); empty on the CPU.
  const std::map<std::string, size_t> &stepsOnHost() const;

  // Global state goes in and out through copies, never through pointers into
  // the session: on a device the values live in device memory. `bytes` must
  // equal the global's size; only mutable roles (parameters, optimizer state,
  // gradients, scalar state) can be written.
  Status readGlobal(size_t index, void *dst, size_t bytes) const;
  Status writeGlobal(size_t index, const void *src, size_t bytes);
  // Global `index` as a host tensor (a copy).
  StatusOr<HostTensor> readGlobal(size_t index) const;
  // `bytes` of global `index` from byte `offset` on (one slot of a stacked
  // global: an adapter of a --max-loras plan), the rest left as it is. The
  // global must be held whole (not split by --shard).
  Status writeGlobalPart(size_t index, size_t offset, const void *src, size_t bytes);
  // Plans compiled with --shard optimizer|grads: the rank that holds global
  // `index` (a parameter's optimizer state lives on the rank that updates the
  // parameter), or -1 when every rank holds it. Reading or writing a global
  // this rank does not hold is an error.
  int globalOwner(size_t index) const;
  // True when this rank holds the whole of global `index` (not another
  // rank's, nor split by rows over several).
  bool holdsGlobal(size_t index) const;
  // --shard params: whether global `index` is split by rows over the ranks,
  // the rows this rank keeps, and their bytes. writeGlobal of such a global
  // takes the whole value and keeps this rank's rows; reading the whole value
  // needs every rank (sd::train::gatherToRankZero).
  bool rowSharded(size_t index) const;
  RowBlock globalRows(size_t index) const;
  Status readGlobalRows(size_t index, std::vector<uint8_t> &rows) const;
  // This rank's rows only (a sharded checkpoint's piece); for a global not
  // split by rows, the whole value as writeGlobal takes it.
  Status writeGlobalRows(size_t index, const void *rows, size_t bytes);
  // Index of the entry or global called `name`, or -1.
  int64_t findEntry(const std::string &name) const;
  int64_t findGlobal(const std::string &name) const;

  // Per-contract time accumulated over runs while profiling is on.
  struct OpProfile {
    std::string op;
    double ms = 0;
    int64_t calls = 0;
  };
  void setProfiling(bool on);
  std::vector<OpProfile> profile() const;
  // While profiling, also one event per kernel run (a timeline for Chrome's
  // trace viewer), up to kMaxTraceEvents; later runs count as dropped.
  struct TraceEvent {
    std::string op, location;
    uint32_t entry = 0;
    double startUs = 0, durationUs = 0; // since profiling was turned on
  };
  static constexpr size_t kMaxTraceEvents = 1 << 21;
  const std::vector<TraceEvent> &trace() const;
  size_t droppedTraceEvents() const;

private:
  struct Impl;
  Session() = default;
  Status runSteps(size_t entry); // eager, captured or replayed
  Status runEager(size_t entry);
  Status runEager(size_t entry, size_t begin, size_t end);
  Status runLoop(const KernelContext &loop, size_t bodyIndex);
  Status runIf(const KernelContext &step, size_t thenIndex, size_t elseIndex);
  std::shared_ptr<const Plan> plan_;
  std::unique_ptr<Impl> impl_;
};

} // namespace sd
