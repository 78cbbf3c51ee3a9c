// CUDA kernels of AllReduce, Broadcast and ReduceToOwner for a session that runs alone (a
// world of one): the identity. Sessions refuse a CUDA device with several ranks until the
// NCCL backend exists, so no cross-rank reduction reaches this kernel.
#include "cuda_util.cuh"
#include "sd/ops/communicator.h"

namespace sd::cuda {
namespace {

// Every collective alike: the results take the operands' values.
Status worldOfOne(const KernelContext &c, const char *op) {
  if (c.comm && c.comm->size() > 1) return sdError(op, " over ", c.comm->size(), " ranks on CUDA needs NCCL, which is not built yet");
  for (size_t i = 0; i < c.inputs.size() && i < c.outputs.size(); ++i)
    if (c.outputs[i].data != c.inputs[i].data)
      SD_RETURN_IF_ERROR(cudaCheck(cudaMemcpyAsync(c.outputs[i].data, c.inputs[i].data, c.inputs[i].byteSize(),
                                                   cudaMemcpyDeviceToDevice, streamOf(c)),
                                   op));
  return Status::ok();
}

Status AllReduceKernel(const KernelContext &c) { return worldOfOne(c, "AllReduce"); }
Status BroadcastKernel(const KernelContext &c) { return worldOfOne(c, "Broadcast"); }
Status ReduceToOwnerKernel(const KernelContext &c) { return worldOfOne(c, "ReduceToOwner"); }

} // namespace

void registerCollectiveKernels() {
  for (auto [op, fn] : {std::pair{"AllReduce", &AllReduceKernel}, {"Broadcast", &BroadcastKernel},
                        {"ReduceToOwner", &ReduceToOwnerKernel}})
    registerKernel(op, fn, collectiveTypes());
}

} // namespace sd::cuda
