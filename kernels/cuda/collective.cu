// CUDA kernels of AllReduce, Broadcast, ReduceToOwner, AllGatherRows and ReduceScatterRows
// for a session that runs alone (a world of one): the identity, and acc + delta. Sessions refuse a CUDA device with several ranks until the
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

Status AllGatherRowsKernel(const KernelContext &c) { return worldOfOne(c, "AllGatherRows"); }

__global__ void addRows(const float *acc, const float *delta, float *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = acc[i] + delta[i];
}

Status ReduceScatterRowsKernel(const KernelContext &c) {
  if (c.comm && c.comm->size() > 1)
    return sdError("ReduceScatterRows over ", c.comm->size(), " ranks on CUDA needs NCCL, which is not built yet");
  const int64_t n = c.outputs[0].numElements();
  if (n) addRows<<<blocksFor(n), kThreads, 0, streamOf(c)>>>(c.inputs[0].as<float>(), c.inputs[1].as<float>(),
                                                        c.outputs[0].as<float>(), n);
  return launchStatus("ReduceScatterRows");
}

} // namespace

void registerCollectiveKernels() {
  for (auto [op, fn] : {std::pair{"AllReduce", &AllReduceKernel}, {"Broadcast", &BroadcastKernel},
                        {"ReduceToOwner", &ReduceToOwnerKernel}, {"AllGatherRows", &AllGatherRowsKernel}})
    registerKernel(op, fn, collectiveTypes());
  registerKernel("ReduceScatterRows", &ReduceScatterRowsKernel, TypeSet{DType::F32});
}

} // namespace sd::cuda
