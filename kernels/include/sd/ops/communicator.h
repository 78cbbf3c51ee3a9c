// The collectives that a plan's communication steps (AllReduce) and the
// trainer's cross-rank agreements call. runtime/comm implements it over MPI
// for CPU ranks; a session without a communicator is a world of one, where
// every collective is the identity. Kernels see only this interface, so the
// op library links no MPI or NCCL.
#pragma once
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include "sd/ops/kernel.h"
#include <memory>
#include <string>
#include <vector>

namespace sd {

enum class ReduceOp { Sum, Max };

// What the collective ops (AllReduce, Broadcast, ReduceToOwner) carry, on
// every backend: the element types MPI and NCCL both reduce.
inline TypeSet collectiveTypes() { return TypeSet{DType::F32, DType::F64, DType::I32, DType::I64}; }

// A collective in flight; wait() completes it and reports its error.
class CommRequest {
public:
  virtual ~CommRequest() = default;
  virtual Status wait() = 0;
  // Lets it advance without waiting (MPI's nonblocking collectives progress
  // only inside MPI calls).
  virtual void test() {}
};

// Collectives on device memory, enqueued on a device stream (a cudaStream_t)
// and so capturable into a CUDA graph: the NCCL backend. Counts and layouts
// as Communicator's; they return once the work is enqueued.
class StreamCollectives {
public:
  virtual ~StreamCollectives() = default;
  virtual Status allReduce(const void *send, void *recv, size_t count, DType type, ReduceOp op, void *stream) = 0;
  // An all-reduce that runs beside `stream` (on the backend's own stream,
  // after the work enqueued on `stream` so far) while later work on `stream`
  // goes on; join() makes `stream` wait for every such one. Both capturable.
  virtual Status allReduceBeside(const void *send, void *recv, size_t count, DType type, ReduceOp op, void *stream) = 0;
  virtual Status join(void *stream) = 0;
  virtual Status broadcast(void *data, size_t count, DType type, int root, void *stream) = 0;
  virtual Status reduce(const void *send, void *recv, size_t count, DType type, ReduceOp op, int root, void *stream) = 0;
  virtual Status allGatherV(const void *send, void *recv, const std::vector<size_t> &counts, DType type, void *stream) = 0;
  virtual Status reduceScatterV(const void *send, void *recv, const std::vector<size_t> &counts, DType type, ReduceOp op,
                                void *stream) = 0;
};

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The backend and its library, for the one line a launch prints ("MPI (Open MPI v4.1.4)").
  virtual std::string describe() const = 0;

  // Collectives over memory the communicator's device can reach (host memory
  // for MPI). In place when send == recv. They return once the operation is
  // started; the request's wait() completes it.
  virtual StatusOr<std::unique_ptr<CommRequest>> startAllReduce(const void *send, void *recv, size_t count, DType type,
                                                                ReduceOp op) = 0;
  // recv (recvCount elements) gets this rank's block of the reduced send
  // (size() * recvCount elements), blocks in rank order.
  virtual StatusOr<std::unique_ptr<CommRequest>> startReduceScatter(const void *send, void *recv, size_t recvCount,
                                                                    DType type, ReduceOp op) = 0;
  // recv (size() * sendCount elements) gets every rank's send, in rank order.
  virtual StatusOr<std::unique_ptr<CommRequest>> startAllGather(const void *send, void *recv, size_t sendCount,
                                                                DType type) = 0;
  virtual StatusOr<std::unique_ptr<CommRequest>> startBroadcast(void *data, size_t count, DType type, int root) = 0;
  // The sum (or max) over the ranks into `root`'s recv; other ranks' recv is untouched.
  virtual StatusOr<std::unique_ptr<CommRequest>> startReduce(const void *send, void *recv, size_t count, DType type,
                                                             ReduceOp op, int root) = 0;
  // Uneven blocks (row-sharded tensors, --shard params): rank r's block has
  // counts[r] elements, the blocks back to back in rank order. allGatherV:
  // send (counts[rank()] elements) to every rank's recv (all blocks).
  // reduceScatterV: recv (counts[rank()] elements) gets its block of send
  // (all blocks) summed over the ranks. Blocking: they run inside a step.
  virtual Status allGatherV(const void *send, void *recv, const std::vector<size_t> &counts, DType type) = 0;
  virtual Status reduceScatterV(const void *send, void *recv, const std::vector<size_t> &counts, DType type,
                                ReduceOp op) = 0;
  virtual Status barrier() = 0;
  // Ends every rank's process with `exitCode`. For an error on one rank: the
  // others would wait for it in their next collective forever, and a clean
  // shutdown (MPI_Finalize) is itself collective.
  [[noreturn]] virtual void abort(int exitCode) = 0;
  // The device collectives of a backend that has them (NCCL); null for
  // host-memory backends (MPI). A device session with several ranks needs them.
  virtual StreamCollectives *onStreams() { return nullptr; }
  // What this rank is doing ("step 12"; empty: between steps), for the
  // message of a collective that fails or hangs.
  virtual void notePhase(const std::string &phase) {}

  // Collectives a step started and a later step completes (an AllReduce
  // marked async, then WaitCollectives): held here in between. Steps run one
  // at a time, so one list per communicator.
  void defer(std::unique_ptr<CommRequest> r) { deferred_.push_back(std::move(r)); }
  bool hasDeferred() const { return !deferred_.empty(); }
  // Called between steps while any is deferred.
  void advanceDeferred() {
    for (auto &r : deferred_) r->test();
  }
  // Completes them all, in the order they started; the first error wins.
  Status waitDeferred() {
    Status first;
    for (auto &r : deferred_)
      if (Status s = r->wait(); first.isOk()) first = s;
    deferred_.clear();
    return first;
  }

  // Blocking forms: start + wait unless the backend has faster ones (Open
  // MPI's blocking collectives are tuned; its nonblocking ones run 2-4x
  // slower on large messages, bench/RESULTS.md).
  virtual Status allReduce(const void *send, void *recv, size_t count, DType type, ReduceOp op) {
    return finish(startAllReduce(send, recv, count, type, op));
  }
  virtual Status reduceScatter(const void *send, void *recv, size_t recvCount, DType type, ReduceOp op) {
    return finish(startReduceScatter(send, recv, recvCount, type, op));
  }
  virtual Status allGather(const void *send, void *recv, size_t sendCount, DType type) {
    return finish(startAllGather(send, recv, sendCount, type));
  }
  virtual Status broadcast(void *data, size_t count, DType type, int root) {
    return finish(startBroadcast(data, count, type, root));
  }
  virtual Status reduce(const void *send, void *recv, size_t count, DType type, ReduceOp op, int root) {
    return finish(startReduce(send, recv, count, type, op, root));
  }

protected:
  static Status finish(StatusOr<std::unique_ptr<CommRequest>> r) { return r.isOk() ? r.value()->wait() : r.status(); }

private:
  std::vector<std::unique_ptr<CommRequest>> deferred_;
};

// True when another rank owns this step's parameter (--shard optimizer): the
// update happens there, and this rank only zeroes its copy of the gradient.
inline bool ownedByAnotherRank(const KernelContext &c) {
  return c.shardOwner >= 0 && c.comm && c.shardOwner != c.comm->rank();
}

} // namespace sd
