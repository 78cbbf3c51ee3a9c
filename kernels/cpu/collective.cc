// CPU kernels of the collectives, through the session's communicator (MPI):
// AllReduce (the data-parallel gradient reduction), Broadcast (a sharded
// optimizer's updated parameters from their owner) and ReduceToOwner (a
// micro-batch's gradient to the rank that holds it, --shard grads). Alone,
// all are the identity.
#include "cpu_util.h"
#include "sd/ops/communicator.h"
#include <algorithm>
#include <cstring>
#include <numeric>

namespace sd::cpu {
namespace {

constexpr uintptr_t kBufferAlign = 64; // every plan buffer starts on, and pads to, 64 bytes

// Calls `send(pointer, count)` once per run of results adjacent in memory
// (the gradient and parameter globals are allocated back to back): the
// 64-byte alignment padding between two plan buffers belongs to the first,
// so sending it too touches nothing else. Counts stay below 2^30 (MPI counts
// are ints). Bufferized plans give each result its operand's memory; anywhere
// else the result takes a copy first.
template <class Send> Status forEachRun(const KernelContext &c, const char *op, Send &&send) {
  SD_CHECK_ARG(c.outputs.size() == c.inputs.size(), op, ": ", c.inputs.size(), " operands but ", c.outputs.size(),
               " results");
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.outputs[i].data != c.inputs[i].data) std::memmove(c.outputs[i].data, c.inputs[i].data, c.inputs[i].byteSize());
  if (!c.comm || c.comm->size() == 1) return Status::ok();
  std::vector<size_t> order(c.outputs.size());
  std::iota(order.begin(), order.end(), 0);
  auto addr = [&](size_t i) { return reinterpret_cast<uintptr_t>(c.outputs[i].data); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return addr(a) < addr(b); });
  const size_t elem = dtypeSize(c.outputs[0].dtype);
  for (size_t k = 0; k < order.size();) {
    uintptr_t start = addr(order[k]), end = start + c.outputs[order[k]].byteSize();
    size_t next = k + 1;
    for (; next < order.size(); ++next) {
      uintptr_t padded = (end + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
      if (addr(order[next]) != padded || start % kBufferAlign || (padded - start) % elem) break;
      end = padded + c.outputs[order[next]].byteSize();
    }
    for (size_t done = 0, count = (end - start) / elem; done < count;) {
      size_t piece = std::min<size_t>(count - done, size_t(1) << 30);
      SD_RETURN_IF_ERROR(send(reinterpret_cast<uint8_t *>(start) + done * elem, piece).withContext(std::string(op) + ": "));
      done += piece;
    }
    k = next;
  }
  return Status::ok();
}

// One blocking call per run: Open MPI's blocking all-reduce is faster than
// its nonblocking one (bench/RESULTS.md), and nothing else runs meanwhile.
Status AllReduceKernel(const KernelContext &c) {
  return forEachRun(c, "AllReduce", [&](void *p, size_t n) {
    return c.comm->allReduce(p, p, n, c.outputs[0].dtype, ReduceOp::Sum);
  });
}

Status BroadcastKernel(const KernelContext &c) {
  const int root = c.shardOwner >= 0 ? c.shardOwner : int(c.attrs.getInt("root", 0));
  if (c.comm) SD_CHECK_ARG(root < c.comm->size(), "Broadcast: root ", root, " is not a rank of ", c.comm->size());
  return forEachRun(c, "Broadcast", [&](void *p, size_t n) { return c.comm->broadcast(p, n, c.outputs[0].dtype, root); });
}

Status ReduceToOwnerKernel(const KernelContext &c) {
  SD_CHECK_ARG(!c.comm || (c.shardOwner >= 0 && c.shardOwner < c.comm->size()),
               "ReduceToOwner: the step has no owner rank (shard_param)");
  return forEachRun(c, "ReduceToOwner", [&](void *p, size_t n) {
    return c.comm->reduce(p, p, n, c.outputs[0].dtype, ReduceOp::Sum, c.shardOwner);
  });
}

} // namespace

void registerCollectiveKernels() {
  registerCpuKernel("AllReduce", AllReduceKernel, collectiveTypes());
  registerCpuKernel("Broadcast", BroadcastKernel, collectiveTypes());
  registerCpuKernel("ReduceToOwner", ReduceToOwnerKernel, collectiveTypes());
}

} // namespace sd::cpu
