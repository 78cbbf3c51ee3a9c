// CUDA kernels of AllReduce, WaitCollectives, Broadcast, ReduceToOwner,
// AllGatherRows and ReduceScatterRows. With an NCCL communicator (Communicator::onStreams) they
// enqueue NCCL collectives on the session's stream, so a captured training
// step holds them; a world of one without one is the identity (and
// acc + delta). Several ranks without NCCL are refused.
#include "cuda_util.cuh"
#include "sd/ops/collective_layout.h"
#include "sd/ops/communicator.h"

namespace sd::cuda {
namespace {

// The communicator's device collectives; null for a world of one without
// NCCL. Unless `beside`, the session's stream first waits for the
// all-reduces running beside it: collectives on one communicator complete in
// the order they were issued, on every rank.
StatusOr<StreamCollectives *> streamCollectives(const KernelContext &c, const char *op, bool beside = false) {
  StreamCollectives *s = c.comm ? c.comm->onStreams() : nullptr;
  if (!s && c.comm && c.comm->size() > 1)
    return sdError(op, " over ", c.comm->size(), " ranks on CUDA needs the NCCL backend (", c.comm->describe(),
                   " works on host memory)");
  if (s && !beside) SD_RETURN_IF_ERROR(s->join(c.stream).withContext(std::string(op) + ": "));
  return s;
}

// Results take their operands' values, then `send(pointer, count)` runs once
// per run of results adjacent in memory.
template <class Send> Status forEachRun(const KernelContext &c, const char *op, Send &&send, bool beside = false) {
  SD_CHECK_ARG(c.outputs.size() == c.inputs.size(), op, ": ", c.inputs.size(), " operands but ", c.outputs.size(),
               " results");
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.outputs[i].data != c.inputs[i].data)
      SD_RETURN_IF_ERROR(cudaCheck(cudaMemcpyAsync(c.outputs[i].data, c.inputs[i].data, c.inputs[i].byteSize(),
                                                   cudaMemcpyDeviceToDevice, streamOf(c)),
                                   op));
  auto s = streamCollectives(c, op, beside);
  if (!s.isOk()) return s.status();
  if (!s.value()) return Status::ok();
  for (const MemoryRun &run : contiguousRuns(c.outputs))
    SD_RETURN_IF_ERROR(send(s.value(), run.start, run.count).withContext(std::string(op) + ": "));
  return Status::ok();
}

// `async` (a bucket reduced while the backward goes on): on NCCL's own
// stream, beside the session's; WaitCollectives joins it back.
Status AllReduceKernel(const KernelContext &c) {
  const bool async = c.attrs.getInt("async", 0) != 0;
  return forEachRun(
      c, "AllReduce",
      [&](StreamCollectives *s, void *p, size_t n) {
        return async ? s->allReduceBeside(p, p, n, c.outputs[0].dtype, ReduceOp::Sum, c.stream)
                     : s->allReduce(p, p, n, c.outputs[0].dtype, ReduceOp::Sum, c.stream);
      },
      async);
}

// The session's stream waits for the all-reduces started beside it.
Status WaitCollectivesKernel(const KernelContext &c) {
  return forEachRun(c, "WaitCollectives", [](StreamCollectives *, void *, size_t) { return Status::ok(); });
}

Status BroadcastKernel(const KernelContext &c) {
  const int root = c.shardOwner >= 0 ? c.shardOwner : int(c.attrs.getInt("root", 0));
  if (c.comm) SD_CHECK_ARG(root < c.comm->size(), "Broadcast: root ", root, " is not a rank of ", c.comm->size());
  return forEachRun(c, "Broadcast", [&](StreamCollectives *s, void *p, size_t n) {
    return s->broadcast(p, n, c.outputs[0].dtype, root, c.stream);
  });
}

Status ReduceToOwnerKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(checkOwner(c));
  return forEachRun(c, "ReduceToOwner", [&](StreamCollectives *s, void *p, size_t n) {
    return s->reduce(p, p, n, c.outputs[0].dtype, ReduceOp::Sum, c.shardOwner, c.stream);
  });
}

// The shard holds this rank's rows of the output's dims.
Status AllGatherRowsKernel(const KernelContext &c) {
  const TensorView &shard = c.inputs[0], &full = c.outputs[0];
  auto counts = gatherRowCounts(c);
  if (!counts.isOk()) return counts.status();
  auto s = streamCollectives(c, "AllGatherRows");
  if (!s.isOk()) return s.status();
  if (s.value())
    return s.value()->allGatherV(shard.data, full.data, counts.value(), full.dtype, c.stream).withContext("AllGatherRows: ");
  if (full.data == shard.data) return Status::ok();
  return cudaCheck(cudaMemcpyAsync(full.data, shard.data, shard.byteSize(), cudaMemcpyDeviceToDevice, streamOf(c)),
                   "AllGatherRows");
}

__global__ void addRows(const float *acc, const float *delta, float *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = acc[i] + delta[i];
}

// out (this rank's rows) = acc (the same rows) + those rows of delta summed over the ranks.
Status ReduceScatterRowsKernel(const KernelContext &c) {
  const TensorView &acc = c.inputs[0], &delta = c.inputs[1], &out = c.outputs[0];
  auto counts = scatterRowCounts(c);
  if (!counts.isOk()) return counts.status();
  const int64_t n = out.numElements();
  auto s = streamCollectives(c, "ReduceScatterRows");
  if (!s.isOk()) return s.status();
  const float *d = delta.as<float>();
  float *summed = nullptr;
  if (s.value() && n) {
    // Stream-ordered scratch: capturable, and freed after the add on the same stream.
    SD_RETURN_IF_ERROR(cudaCheck(cudaMallocAsync(reinterpret_cast<void **>(&summed), size_t(n) * sizeof(float), streamOf(c)),
                                 "ReduceScatterRows scratch"));
    Status r = s.value()->reduceScatterV(d, summed, counts.value(), DType::F32, ReduceOp::Sum, c.stream);
    if (!r.isOk()) {
      cudaFreeAsync(summed, streamOf(c));
      return r.withContext("ReduceScatterRows: ");
    }
    d = summed;
  }
  if (n) addRows<<<blocksFor(n), kThreads, 0, streamOf(c)>>>(acc.as<float>(), d, out.as<float>(), n);
  Status launched = launchStatus("ReduceScatterRows");
  if (summed) SD_RETURN_IF_ERROR(cudaCheck(cudaFreeAsync(summed, streamOf(c)), "ReduceScatterRows scratch"));
  return launched;
}

} // namespace

void registerCollectiveKernels() {
  for (auto [op, fn] : {std::pair{"AllReduce", &AllReduceKernel}, {"WaitCollectives", &WaitCollectivesKernel},
                        {"Broadcast", &BroadcastKernel}, {"ReduceToOwner", &ReduceToOwnerKernel},
                        {"AllGatherRows", &AllGatherRowsKernel}})
    registerKernel(op, fn, collectiveTypes());
  registerKernel("ReduceScatterRows", &ReduceScatterRowsKernel, TypeSet{DType::F32});
}

} // namespace sd::cuda
