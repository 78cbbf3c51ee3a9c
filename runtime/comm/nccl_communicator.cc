// The NCCL backend of sd::Communicator, built as a plugin (libsdcomm_nccl.so)
// that runtime/comm loads only for ranks on CUDA devices: one GPU per
// process, the communicator made before any graph capture.
//
// Device collectives (StreamCollectives) are enqueued on the session's
// stream, so a captured training step holds them. An all-reduce "beside"
// the session's stream (a gradient bucket reduced while the backward goes
// on) runs on the communicator's side stream, forked from and later joined
// back into the session's stream through events: a capture holds the fork
// and the join as graph edges. Host collectives (the
// trainer's agreements: start state, loss sums, checkpoint entries) go
// through a device staging buffer on the communicator's own stream.
//
// A watchdog thread polls ncclCommGetAsyncError and the time the current
// phase (a training step) has run; past --comm-timeout, or on an NCCL error,
// it aborts the communicator and ends the process non-zero, naming the
// collective and the step, so that a lost rank never leaves the others
// waiting forever.
#include "sd/ops/communicator.h"
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <mutex>
#include <nccl.h>
#include <string>
#include <thread>
#include <vector>

namespace sd {
namespace {

using Clock = std::chrono::steady_clock;

Status ncclStatus(ncclResult_t r, const char *what) {
  if (r == ncclSuccess || r == ncclInProgress) return Status::ok();
  return sdError(what, ": ", ncclGetErrorString(r));
}
Status cudaStatus(cudaError_t e, const char *what) {
  return e == cudaSuccess ? Status::ok() : sdError(what, ": ", cudaGetErrorString(e));
}

StatusOr<ncclDataType_t> ncclType(DType t) {
  switch (t) {
  case DType::F32: return ncclFloat32;
  case DType::F64: return ncclFloat64;
  case DType::F16: return ncclFloat16;
  case DType::BF16: return ncclBfloat16;
  case DType::I32: return ncclInt32;
  case DType::I64: return ncclInt64;
  case DType::U8: return ncclUint8;
  default: return sdError("NCCL collectives take f32, f64, f16, bf16, i32, i64 or u8 data, not ", dtypeName(t));
  }
}
ncclRedOp_t ncclOp(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : ncclSum; }

// Host collectives complete before they return.
class Done final : public CommRequest {
public:
  Status wait() override { return Status::ok(); }
};

class NcclCommunicator final : public Communicator, public StreamCollectives {
public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, double timeoutSeconds)
      : comm_(comm), rank_(rank), size_(size), device_(device), timeout_(timeoutSeconds) {
    int v = 0;
    ncclGetVersion(&v);
    version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    if (forked_) cudaEventDestroy(forked_);
    if (reduced_) cudaEventDestroy(reduced_);
    if (side_) cudaStreamDestroy(side_);
    if (staging_) cudaFree(staging_);
    if (hostStream_) cudaStreamDestroy(hostStream_);
    ncclCommDestroy(comm_);
  }

  // Both interfaces name their collectives alike; the host forms stay visible.
  using Communicator::allReduce;
  using Communicator::broadcast;
  using Communicator::reduce;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return "NCCL " + version_ + " (GPU " + std::to_string(device_) + " of this rank)";
  }
  StreamCollectives *onStreams() override { return this; }

  // Created with the communicator, before any capture (CUDA forbids
  // creating them inside one); false when CUDA refuses, said at open.
  Status makeSideStream() {
    SD_RETURN_IF_ERROR(cudaStatus(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "side stream"));
    SD_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming), "fork event"));
    return cudaStatus(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming), "join event");
  }
  void notePhase(const std::string &phase) override {
    std::lock_guard<std::mutex> g(mu_);
    phase_ = phase;
    phaseStart_ = Clock::now();
  }

  // --- Device collectives, on the caller's stream.
  Status allReduce(const void *send, void *recv, size_t count, DType type, ReduceOp op, void *stream) override {
    auto t = enqueueing("AllReduce", type);
    if (!t.isOk()) return t.status();
    return ncclStatus(ncclAllReduce(send, recv, count, t.value(), ncclOp(op), comm_, cudaStream_t(stream)), "ncclAllReduce");
  }
  // The side stream waits for `stream`'s work so far (the gradients are
  // final), then reduces; re-recording one event per fork is enough, as a
  // wait takes the event's latest record.
  Status allReduceBeside(const void *send, void *recv, size_t count, DType type, ReduceOp op, void *stream) override {
    auto t = enqueueing("AllReduce", type);
    if (!t.isOk()) return t.status();
    SD_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(forked_, cudaStream_t(stream)), "fork to the side stream"));
    SD_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(side_, forked_, 0), "fork to the side stream"));
    SD_RETURN_IF_ERROR(ncclStatus(ncclAllReduce(send, recv, count, t.value(), ncclOp(op), comm_, side_), "ncclAllReduce"));
    besideOpen_ = true;
    return Status::ok();
  }
  // The side stream runs in order, so one event after its last reduction covers them all.
  Status join(void *stream) override {
    if (!besideOpen_) return Status::ok();
    besideOpen_ = false;
    SD_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(reduced_, side_), "join from the side stream"));
    return cudaStatus(cudaStreamWaitEvent(cudaStream_t(stream), reduced_, 0), "join from the side stream");
  }
  Status broadcast(void *data, size_t count, DType type, int root, void *stream) override {
    auto t = enqueueing("Broadcast", type);
    if (!t.isOk()) return t.status();
    return ncclStatus(ncclBroadcast(data, data, count, t.value(), root, comm_, cudaStream_t(stream)), "ncclBroadcast");
  }
  Status reduce(const void *send, void *recv, size_t count, DType type, ReduceOp op, int root, void *stream) override {
    auto t = enqueueing("Reduce", type);
    if (!t.isOk()) return t.status();
    return ncclStatus(ncclReduce(send, recv, count, t.value(), ncclOp(op), root, comm_, cudaStream_t(stream)), "ncclReduce");
  }
  // NCCL has no v-variants: one broadcast (gather) or reduce (scatter) per
  // rank's block, in one group so they run as one operation.
  Status allGatherV(const void *send, void *recv, const std::vector<size_t> &counts, DType type, void *stream) override {
    return perRankBlock("AllGatherRows", "ncclBroadcast", counts, type, [&](int r, size_t offset, ncclDataType_t t) {
      return ncclBroadcast(r == rank_ ? send : nullptr, static_cast<uint8_t *>(recv) + offset, counts[size_t(r)], t, r,
                           comm_, cudaStream_t(stream));
    });
  }
  Status reduceScatterV(const void *send, void *recv, const std::vector<size_t> &counts, DType type, ReduceOp op,
                        void *stream) override {
    return perRankBlock("ReduceScatterRows", "ncclReduce", counts, type, [&](int r, size_t offset, ncclDataType_t t) {
      return ncclReduce(static_cast<const uint8_t *>(send) + offset, r == rank_ ? recv : nullptr, counts[size_t(r)], t,
                        ncclOp(op), r, comm_, cudaStream_t(stream));
    });
  }

  // --- Host collectives: staged through device memory on our own stream.
  StatusOr<std::unique_ptr<CommRequest>> startAllReduce(const void *send, void *recv, size_t count, DType type,
                                                        ReduceOp op) override {
    const size_t bytes = count * dtypeSize(type);
    return done(staged(send, bytes, recv, bytes, true, [&](void *in, void *) {
      return allReduce(in, in, count, type, op, hostStream_);
    }));
  }
  StatusOr<std::unique_ptr<CommRequest>> startReduceScatter(const void *send, void *recv, size_t recvCount, DType type,
                                                            ReduceOp op) override {
    return done(reduceScatterV(send, recv, std::vector<size_t>(size_t(size_), recvCount), type, op));
  }
  StatusOr<std::unique_ptr<CommRequest>> startAllGather(const void *send, void *recv, size_t sendCount,
                                                        DType type) override {
    return done(allGatherV(send, recv, std::vector<size_t>(size_t(size_), sendCount), type));
  }
  StatusOr<std::unique_ptr<CommRequest>> startBroadcast(void *data, size_t count, DType type, int root) override {
    const size_t bytes = count * dtypeSize(type);
    return done(staged(data, bytes, data, bytes, true, [&](void *in, void *) {
      return broadcast(in, count, type, root, hostStream_);
    }));
  }
  StatusOr<std::unique_ptr<CommRequest>> startReduce(const void *send, void *recv, size_t count, DType type,
                                                     ReduceOp op, int root) override {
    const size_t bytes = count * dtypeSize(type);
    return done(staged(send, bytes, rank_ == root ? recv : nullptr, bytes, true, [&](void *in, void *) {
      return reduce(in, in, count, type, op, root, hostStream_);
    }));
  }
  Status allGatherV(const void *send, void *recv, const std::vector<size_t> &counts, DType type) override {
    size_t total = 0;
    for (size_t c : counts) total += c;
    const size_t elem = dtypeSize(type);
    return staged(send, counts[size_t(rank_)] * elem, recv, total * elem, false, [&](void *in, void *out) {
      return allGatherV(in, out, counts, type, hostStream_);
    });
  }
  Status reduceScatterV(const void *send, void *recv, const std::vector<size_t> &counts, DType type,
                        ReduceOp op) override {
    size_t total = 0;
    for (size_t c : counts) total += c;
    const size_t elem = dtypeSize(type);
    return staged(send, total * elem, recv, counts[size_t(rank_)] * elem, false, [&](void *in, void *out) {
      return reduceScatterV(in, out, counts, type, op, hostStream_);
    });
  }
  Status barrier() override {
    int32_t one = 1;
    return allReduce(&one, &one, 1, DType::I32, ReduceOp::Sum);
  }
  [[noreturn]] void abort(int exitCode) override {
    ncclCommAbort(comm_);
    std::fflush(nullptr);
    std::_Exit(exitCode);
  }

private:
  // `call(rank, byte offset of its block, type)` for every rank, as one NCCL group.
  template <class Call>
  Status perRankBlock(const char *collective, const char *what, const std::vector<size_t> &counts, DType type, Call &&call) {
    auto t = enqueueing(collective, type);
    if (!t.isOk()) return t.status();
    SD_RETURN_IF_ERROR(ncclStatus(ncclGroupStart(), "ncclGroupStart"));
    Status s;
    size_t at = 0;
    for (int r = 0; r < size_ && s.isOk(); at += counts[size_t(r)] * dtypeSize(type), ++r)
      s = ncclStatus(call(r, at, t.value()), what);
    Status end = ncclStatus(ncclGroupEnd(), "ncclGroupEnd");
    return s.isOk() ? end : s;
  }

  StatusOr<ncclDataType_t> enqueueing(const char *collective, DType type) {
    std::lock_guard<std::mutex> g(mu_);
    last_ = collective;
    return ncclType(type);
  }

  static StatusOr<std::unique_ptr<CommRequest>> done(Status s) {
    if (!s.isOk()) return s;
    return std::unique_ptr<CommRequest>(new Done());
  }

  // Copies `in` into device memory, runs `op(deviceIn, deviceOut)` on the
  // host stream and copies `outBytes` back into `out` (when given) from
  // deviceOut, or from deviceIn for an op that works in place; then waits.
  template <class Op>
  Status staged(const void *in, size_t inBytes, void *out, size_t outBytes, bool inPlace, Op &&op) {
    std::lock_guard<std::mutex> g(hostMu_);
    const size_t outAt = inPlace ? 0 : (inBytes + 255) / 256 * 256;
    SD_RETURN_IF_ERROR(reserve(std::max<size_t>(1, std::max(inBytes, outAt + outBytes))));
    uint8_t *dev = static_cast<uint8_t *>(staging_);
    if (inBytes)
      SD_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(dev, in, inBytes, cudaMemcpyHostToDevice, hostStream_), "staging"));
    SD_RETURN_IF_ERROR(op(dev, dev + outAt));
    if (out && outBytes)
      SD_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(out, dev + outAt, outBytes, cudaMemcpyDeviceToHost, hostStream_), "staging"));
    return cudaStatus(cudaStreamSynchronize(hostStream_), "NCCL host collective");
  }
  Status reserve(size_t bytes) {
    if (!hostStream_) SD_RETURN_IF_ERROR(cudaStatus(cudaStreamCreateWithFlags(&hostStream_, cudaStreamNonBlocking), "stream"));
    if (bytes <= stagingBytes_) return Status::ok();
    if (staging_) cudaFree(staging_);
    staging_ = nullptr;
    stagingBytes_ = 0;
    SD_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&staging_, bytes), "staging buffer"));
    stagingBytes_ = bytes;
    return Status::ok();
  }

  // The watchdog: an NCCL error, or a phase running past the timeout, ends the process.
  void watch() {
    std::unique_lock<std::mutex> g(mu_);
    while (!stopping_) {
      wake_.wait_for(g, std::chrono::milliseconds(200));
      if (stopping_) break;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      const double ran = std::chrono::duration<double>(Clock::now() - phaseStart_).count();
      const bool hung = !phase_.empty() && ran > timeout_;
      if (async == ncclSuccess || async == ncclInProgress) {
        if (!hung) continue;
      }
      std::fprintf(stderr, "sdrun: error: rank %d: NCCL %s in %s: %s; aborting the communicator\n", rank_, last_.c_str(),
                   phase_.empty() ? "a host collective" : phase_.c_str(),
                   hung ? ("no progress within --comm-timeout " + std::to_string(int(timeout_)) + " s").c_str()
                        : ncclGetErrorString(async));
      std::fflush(stderr);
      ncclCommAbort(comm_);
      std::_Exit(3);
    }
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  double timeout_;
  std::string version_;
  std::mutex mu_; // phase_, last_, stopping_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::string phase_, last_ = "(none yet)";
  Clock::time_point phaseStart_ = Clock::now();
  std::thread watchdog_;
  std::mutex hostMu_; // the staging buffer
  cudaStream_t hostStream_ = nullptr;
  cudaStream_t side_ = nullptr;                        // all-reduces beside the session's stream
  cudaEvent_t forked_ = nullptr, reduced_ = nullptr;  // fork into it, join back from it
  bool besideOpen_ = false;                            // reductions on side_ not yet joined
  void *staging_ = nullptr;
  size_t stagingBytes_ = 0;
};

void copyError(const std::string &m, char *err, size_t n) {
  if (n) std::snprintf(err, n, "%s", m.c_str());
}

} // namespace
} // namespace sd

// The plugin's two entry points (dlsym'd by runtime/comm/world.cc).
extern "C" __attribute__((visibility("default"))) int sd_comm_nccl_unique_id(char *out, size_t n, char *err, size_t errn) {
  ncclUniqueId id;
  if (n < sizeof id) return sd::copyError("buffer too small for an NCCL id", err, errn), 0;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    return sd::copyError(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r), err, errn), 0;
  std::memcpy(out, &id, sizeof id);
  return int(sizeof id);
}

extern "C" __attribute__((visibility("default"))) sd::Communicator *
sd_comm_nccl_open(const char *id, size_t idBytes, int rank, int size, int localRank, double timeoutSeconds, char *err,
                  size_t errn) {
  ncclUniqueId uid;
  if (idBytes != sizeof uid) return sd::copyError("the NCCL id has the wrong size", err, errn), nullptr;
  std::memcpy(&uid, id, sizeof uid);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return sd::copyError("no CUDA GPU for the NCCL backend", err, errn), nullptr;
  const int device = localRank % devices; // one GPU per process
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return sd::copyError(std::string("cudaSetDevice: ") + cudaGetErrorString(e), err, errn), nullptr;
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, size, uid, rank); r != ncclSuccess)
    return sd::copyError(std::string("ncclCommInitRank: ") + ncclGetErrorString(r), err, errn), nullptr;
  auto *c = new sd::NcclCommunicator(comm, rank, size, device, timeoutSeconds);
  if (sd::Status s = c->makeSideStream(); !s.isOk()) {
    delete c;
    return sd::copyError(s.message(), err, errn), nullptr;
  }
  return c;
}
