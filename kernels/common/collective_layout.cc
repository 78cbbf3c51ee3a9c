// Message layout of the collective kernels (sd/ops/collective_layout.h).
#include "sd/ops/collective_layout.h"
#include "sd/format/row_shard.h"
#include "sd/ops/communicator.h"
#include <algorithm>
#include <cstdint>
#include <numeric>

namespace sd {

constexpr uintptr_t kBufferAlign = 64; // every plan buffer starts on, and pads to, 64 bytes

std::vector<MemoryRun> contiguousRuns(const std::vector<TensorView> &tensors) {
  std::vector<MemoryRun> runs;
  if (tensors.empty()) return runs;
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  auto addr = [&](size_t i) { return reinterpret_cast<uintptr_t>(tensors[i].data); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return addr(a) < addr(b); });
  const size_t elem = dtypeSize(tensors[0].dtype);
  for (size_t k = 0; k < order.size();) {
    uintptr_t start = addr(order[k]), end = start + tensors[order[k]].byteSize();
    size_t next = k + 1;
    for (; next < order.size(); ++next) {
      uintptr_t padded = (end + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
      if (addr(order[next]) != padded || start % kBufferAlign || (padded - start) % elem) break;
      end = padded + tensors[order[next]].byteSize();
    }
    for (size_t done = 0, count = (end - start) / elem; done < count;) {
      size_t piece = std::min<size_t>(count - done, size_t(1) << 30);
      runs.push_back({reinterpret_cast<uint8_t *>(start) + done * elem, piece});
      done += piece;
    }
    k = next;
  }
  return runs;
}

std::vector<size_t> rowCounts(const Dims &dims, int ranks) {
  const int64_t rowElems = product(Dims(dims.begin() + 1, dims.end()));
  std::vector<size_t> counts;
  for (int r = 0; r < ranks; ++r) counts.push_back(size_t(rowBlock(dims[0], r, ranks).count * rowElems));
  return counts;
}

StatusOr<std::vector<size_t>> gatherRowCounts(const KernelContext &c) {
  const TensorView &shard = c.inputs[0], &full = c.outputs[0];
  const int ranks = c.comm ? c.comm->size() : 1, rank = c.comm ? c.comm->rank() : 0;
  std::vector<size_t> counts = rowCounts(full.dims, ranks);
  SD_CHECK_ARG(shard.numElements() == int64_t(counts[size_t(rank)]), "AllGatherRows: this rank holds ",
               shard.numElements(), " elements of ", formatDims(full.dims), ", its rows have ", counts[size_t(rank)]);
  return counts;
}

StatusOr<std::vector<size_t>> scatterRowCounts(const KernelContext &c) {
  const TensorView &acc = c.inputs[0], &delta = c.inputs[1], &out = c.outputs[0];
  const int ranks = c.comm ? c.comm->size() : 1, rank = c.comm ? c.comm->rank() : 0;
  std::vector<size_t> counts = rowCounts(delta.dims, ranks);
  const int64_t n = int64_t(counts[size_t(rank)]);
  SD_CHECK_ARG(acc.numElements() == n && out.numElements() == n, "ReduceScatterRows: this rank holds ",
               acc.numElements(), " elements of ", formatDims(delta.dims), ", its rows have ", n);
  return counts;
}

Status checkOwner(const KernelContext &c) {
  SD_CHECK_ARG(!c.comm || (c.shardOwner >= 0 && c.shardOwner < c.comm->size()),
               "ReduceToOwner: the step has no owner rank (shard_param)");
  return Status::ok();
}

} // namespace sd
