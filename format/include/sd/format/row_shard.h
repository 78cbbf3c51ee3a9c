// Row sharding (sdc compile --shard params, FSDP2's Shard(0)): a global's
// rows (dim 0) are split over the ranks of a data-parallel world in blocks
// of ceil(rows / ranks), in rank order, as torch.chunk splits them, so the
// last ranks may hold fewer rows or none. The compiler, the session, the
// collective kernels and the checkpoint code all place rows by this one rule.
#pragma once
#include <algorithm>
#include <cstdint>

namespace sd {

struct RowBlock {
  int64_t begin = 0, count = 0;
};

inline RowBlock rowBlock(int64_t rows, int rank, int ranks) {
  if (ranks <= 1) return {0, rows};
  const int64_t per = (rows + ranks - 1) / ranks;
  const int64_t begin = std::min<int64_t>(rows, per * rank);
  return {begin, std::min<int64_t>(rows, begin + per) - begin};
}

namespace abi {
// The plan config's list of row-sharded globals (parameters, frozen weights
// and the training state of sharded parameters).
constexpr const char *kRowShardedConfigKey = "row_sharded";
} // namespace abi

} // namespace sd
