// CPU kernel of AllReduce: the data-parallel gradient reduction, through the
// session's communicator (MPI). Alone, it is the identity.
#include "cpu_util.h"
#include "sd/ops/communicator.h"
#include <algorithm>
#include <cstring>
#include <numeric>

namespace sd::cpu {
namespace {

constexpr uintptr_t kBufferAlign = 64; // every plan buffer starts on, and pads to, 64 bytes

// Bufferized plans give each result its operand's memory (the gradient
// globals, reduced in place); anywhere else the result takes a copy first.
Status AllReduceKernel(const KernelContext &c) {
  SD_CHECK_ARG(c.outputs.size() == c.inputs.size(), "AllReduce: ", c.inputs.size(), " operands but ",
               c.outputs.size(), " results");
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.outputs[i].data != c.inputs[i].data) std::memmove(c.outputs[i].data, c.inputs[i].data, c.inputs[i].byteSize());
  if (!c.comm || c.comm->size() == 1) return Status::ok();
  // Tensors that follow each other in memory (as the gradient globals do)
  // go out as one message: the 64-byte alignment padding between two plan
  // buffers belongs to the first, so reducing it too touches nothing else.
  std::vector<size_t> order(c.outputs.size());
  std::iota(order.begin(), order.end(), 0);
  auto addr = [&](size_t i) { return reinterpret_cast<uintptr_t>(c.outputs[i].data); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return addr(a) < addr(b); });
  const DType type = c.outputs[0].dtype;
  const size_t elem = dtypeSize(type);
  // One blocking reduction per run: Open MPI's blocking all-reduce is faster
  // than its nonblocking one (bench/RESULTS.md), and nothing else runs meanwhile.
  for (size_t k = 0; k < order.size();) {
    uintptr_t start = addr(order[k]), end = start + c.outputs[order[k]].byteSize();
    size_t next = k + 1;
    for (; next < order.size(); ++next) {
      uintptr_t padded = (end + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
      if (addr(order[next]) != padded || start % kBufferAlign || (padded - start) % elem) break;
      end = padded + c.outputs[order[next]].byteSize();
    }
    // MPI counts are ints: a span of more than 2^30 elements goes in pieces.
    for (size_t done = 0, count = (end - start) / elem; done < count;) {
      size_t piece = std::min<size_t>(count - done, size_t(1) << 30);
      void *p = reinterpret_cast<uint8_t *>(start) + done * elem;
      SD_RETURN_IF_ERROR(c.comm->allReduce(p, p, piece, type, ReduceOp::Sum).withContext("AllReduce: "));
      done += piece;
    }
    k = next;
  }
  return Status::ok();
}

} // namespace

void registerCollectiveKernels() {
  registerCpuKernel("AllReduce", AllReduceKernel, TypeSet{DType::F32, DType::F64, DType::I32, DType::I64});
}

} // namespace sd::cpu
