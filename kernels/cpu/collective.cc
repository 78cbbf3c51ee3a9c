// CPU kernels of the collectives, through the session's communicator (MPI):
// AllReduce (the data-parallel gradient reduction), Broadcast (a sharded
// optimizer's updated parameters from their owner) and ReduceToOwner (a
// micro-batch's gradient to the rank that holds it, --shard grads), and the
// row-sharded pair of --shard params: AllGatherRows (a sharded global whole
// before a step reads it) and ReduceScatterRows (a gradient's rows into the
// rank that keeps them). Alone, all are the identity (or acc + delta).
#include "cpu_util.h"
#include "sd/format/row_shard.h"
#include "sd/ops/collective_layout.h"
#include "sd/ops/communicator.h"
#include <cstring>

namespace sd::cpu {
namespace {

// Calls `send(pointer, count)` once per run of results adjacent in memory
// (sd::contiguousRuns). Bufferized plans give each result its operand's
// memory; anywhere else the result takes a copy first.
template <class Send> Status forEachRun(const KernelContext &c, const char *op, Send &&send) {
  SD_CHECK_ARG(c.outputs.size() == c.inputs.size(), op, ": ", c.inputs.size(), " operands but ", c.outputs.size(),
               " results");
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.outputs[i].data != c.inputs[i].data) std::memmove(c.outputs[i].data, c.inputs[i].data, c.inputs[i].byteSize());
  if (!c.comm || c.comm->size() == 1) return Status::ok();
  for (const MemoryRun &run : contiguousRuns(c.outputs))
    SD_RETURN_IF_ERROR(send(run.start, run.count).withContext(std::string(op) + ": "));
  return Status::ok();
}

// One blocking call per run: Open MPI's blocking all-reduce is faster than
// its nonblocking one (bench/RESULTS.md), and nothing else runs meanwhile.
// `async` (a bucket reduced while the backward goes on): each run is started
// and left to the communicator; a later WaitCollectives step completes it.
Status AllReduceKernel(const KernelContext &c) {
  const bool async = c.attrs.getInt("async", 0) != 0;
  return forEachRun(c, "AllReduce", [&](void *p, size_t n) -> Status {
    if (!async) return c.comm->allReduce(p, p, n, c.outputs[0].dtype, ReduceOp::Sum);
    StatusOr<std::unique_ptr<CommRequest>> r = c.comm->startAllReduce(p, p, n, c.outputs[0].dtype, ReduceOp::Sum);
    if (!r.isOk()) return r.status();
    c.comm->defer(std::move(r.value()));
    return Status::ok();
  });
}

// Completes the collectives earlier steps started (async AllReduce); the
// results are the operands, complete.
Status WaitCollectivesKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(forEachRun(c, "WaitCollectives", [](void *, size_t) { return Status::ok(); }));
  return c.comm ? c.comm->waitDeferred().withContext("WaitCollectives: ") : Status::ok();
}

Status BroadcastKernel(const KernelContext &c) {
  const int root = c.shardOwner >= 0 ? c.shardOwner : int(c.attrs.getInt("root", 0));
  if (c.comm) SD_CHECK_ARG(root < c.comm->size(), "Broadcast: root ", root, " is not a rank of ", c.comm->size());
  return forEachRun(c, "Broadcast", [&](void *p, size_t n) { return c.comm->broadcast(p, n, c.outputs[0].dtype, root); });
}

Status ReduceToOwnerKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(checkOwner(c));
  return forEachRun(c, "ReduceToOwner", [&](void *p, size_t n) {
    return c.comm->reduce(p, p, n, c.outputs[0].dtype, ReduceOp::Sum, c.shardOwner);
  });
}

int ranksOf(const KernelContext &c) { return c.comm ? c.comm->size() : 1; }

// The shard holds this rank's rows of the output's dims.
Status AllGatherRowsKernel(const KernelContext &c) {
  const TensorView &shard = c.inputs[0], &full = c.outputs[0];
  auto counts = gatherRowCounts(c);
  if (!counts.isOk()) return counts.status();
  if (ranksOf(c) == 1) {
    if (full.data != shard.data) std::memcpy(full.data, shard.data, shard.byteSize());
    return Status::ok();
  }
  return c.comm->allGatherV(shard.data, full.data, counts.value(), full.dtype).withContext("AllGatherRows: ");
}

// out (this rank's rows) = acc (the same rows) + those rows of delta summed over the ranks.
Status ReduceScatterRowsKernel(const KernelContext &c) {
  const TensorView &acc = c.inputs[0], &delta = c.inputs[1], &out = c.outputs[0];
  auto counts = scatterRowCounts(c);
  if (!counts.isOk()) return counts.status();
  const int ranks = ranksOf(c);
  const size_t n = size_t(out.numElements());
  const float *d = delta.as<float>();
  // Scratch for the summed rows: a thread's own, grown once (steps run one at a time).
  thread_local std::vector<float> summed;
  if (ranks > 1) {
    summed.resize(n);
    SD_RETURN_IF_ERROR(
        c.comm->reduceScatterV(d, summed.data(), counts.value(), DType::F32, ReduceOp::Sum).withContext("ReduceScatterRows: "));
    d = summed.data();
  }
  const float *a = acc.as<float>();
  float *o = out.as<float>();
  for (size_t i = 0; i < n; ++i) o[i] = a[i] + d[i];
  return Status::ok();
}

} // namespace

void registerCollectiveKernels() {
  registerCpuKernel("AllReduce", AllReduceKernel, collectiveTypes());
  registerCpuKernel("WaitCollectives", WaitCollectivesKernel, collectiveTypes());
  registerCpuKernel("Broadcast", BroadcastKernel, collectiveTypes());
  registerCpuKernel("ReduceToOwner", ReduceToOwnerKernel, collectiveTypes());
  registerCpuKernel("AllGatherRows", AllGatherRowsKernel, collectiveTypes());
  registerCpuKernel("ReduceScatterRows", ReduceScatterRowsKernel, TypeSet{DType::F32});
}

} // namespace sd::cpu
