// How the collective kernels lay their messages out, the same on every
// backend: the results of one step that sit back to back in memory (the
// session allocates gradients and parameters so) go as one message, and a
// row-sharded tensor's blocks follow sd::rowBlock.
#pragma once
#include "sd/format/tensor.h"
#include "sd/ops/kernel.h"
#include <vector>

namespace sd {

// `count` elements from `start`, one message.
struct MemoryRun {
  void *start = nullptr;
  size_t count = 0;
};

// The runs of `tensors` adjacent in memory, each cut into pieces of at most
// 2^30 elements (MPI counts are ints). The 64-byte alignment padding between
// two plan buffers belongs to the first, so sending it too touches nothing
// else. All tensors share one element type.
std::vector<MemoryRun> contiguousRuns(const std::vector<TensorView> &tensors);

// Elements of each rank's rows of a tensor of `dims` (sd::rowBlock).
std::vector<size_t> rowCounts(const Dims &dims, int ranks);

// The kernels' checks, one per op, the same on every backend. Each returns
// the row counts of the step's whole tensor after checking that this rank's
// operands hold its rows: AllGatherRows (shard -> whole), ReduceScatterRows
// (acc and out: this rank's rows of delta).
StatusOr<std::vector<size_t>> gatherRowCounts(const KernelContext &c);
StatusOr<std::vector<size_t>> scatterRowCounts(const KernelContext &c);
// ReduceToOwner: the step names an owner rank of the world.
Status checkOwner(const KernelContext &c);

} // namespace sd
