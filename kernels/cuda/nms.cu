// CUDA kernel of NonMaxSuppression (see kernels/cpu/nms.cc), in two launches
// and with no atomics, so a replay gives the same rows:
//  1. one block per (batch, class) walks its candidates best first, each pick
//     the block-wide largest (score, lower index) key below the last one, and
//     keeps it unless a kept box suppresses it (the threads test the kept
//     boxes together; sd/ops/math/box_overlap.h is the CPU's own geometry);
//  2. one block places the pairs' kept boxes in batch, class, rank order,
//     zero-fills the rest and stores the count.
// A selection larger than the plan's result cannot be refused mid-step: the
// rows that fit are written with the real count, which the session refuses
// when it trims the result. Candidates per class: below 2^32.
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "sd/ops/math/box_overlap.h"
#include <memory>

namespace sd::cuda {
namespace {

constexpr int kNmsThreads = 256;

struct NmsGeometry {
  int64_t batches, classes, n, capacity;
  bool centerPoint;
  // Optional scalar operands on the device (null: absent or empty).
  const int64_t *perClass;
  const float *iou, *scoreThreshold;
};

// Pass 1: kept[pair * n + r] = the r-th box kept for the pair, keptCount[pair] how many.
__global__ void selectPerClassKernel(NmsGeometry g, const float *boxes, const float *scores, int64_t *kept,
                                     int64_t *keptCount) {
  const int64_t pair = blockIdx.x, b = pair / g.classes;
  const float *s = scores + pair * g.n;
  const float *bx = boxes + b * g.n * 4;
  const int64_t limit = g.perClass && *g.perClass > 0 ? (*g.perClass < g.n ? *g.perClass : g.n) : 0;
  const float iou = g.iou ? *g.iou : 0.f;
  int64_t *mine = kept + pair * g.n;
  int64_t count = 0;
  uint64_t last = ~uint64_t(0);
  while (count < limit) {
    uint64_t best = 0;
    for (int64_t i = threadIdx.x; i < g.n; i += blockDim.x) {
      if (g.scoreThreshold && !(s[i] > *g.scoreThreshold)) continue;
      const uint64_t key = math::nmsWalkKey(s[i], i);
      if (key < last && key > best) best = key;
    }
    best = blockReduce(best, MaxOp{}, uint64_t(0));
    if (best == 0) break; // no candidate left
    last = best;
    const int64_t i = math::nmsWalkBox(best);
    const math::Corners box = math::cornersOf(bx + i * 4, g.centerPoint);
    int suppressed = 0;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x)
      suppressed |= math::suppresses(box, math::cornersOf(bx + mine[j] * 4, g.centerPoint), iou) ? 1 : 0;
    suppressed = blockReduce(suppressed, MaxOp{}, 0);
    if (!suppressed) {
      if (threadIdx.x == 0) mine[count] = i;
      ++count;
    }
    __syncthreads(); // mine[count - 1] is seen by every thread's next test
  }
  if (threadIdx.x == 0) keptCount[pair] = count;
}

// Pass 2: rows in batch, class, rank order; offsets has room for pairs + 1.
__global__ void placeRowsKernel(NmsGeometry g, const int64_t *kept, const int64_t *keptCount, int64_t *offsets,
                                int64_t *out, int64_t *count) {
  const int64_t pairs = g.batches * g.classes;
  if (threadIdx.x == 0) {
    int64_t at = 0;
    for (int64_t p = 0; p < pairs; ++p) offsets[p] = at, at += keptCount[p];
    offsets[pairs] = at;
    *count = at;
  }
  __syncthreads();
  const int64_t total = offsets[pairs];
  for (int64_t r = threadIdx.x; r < g.capacity; r += blockDim.x) {
    int64_t *row = out + r * 3;
    if (r >= total) {
      row[0] = row[1] = row[2] = 0;
      continue;
    }
    int64_t lo = 0, hi = pairs - 1; // the pair whose rows hold r: offsets[p] <= r < offsets[p + 1]
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= r) lo = mid;
      else hi = mid - 1;
    }
    row[0] = lo / g.classes, row[1] = lo % g.classes, row[2] = kept[lo * g.n + (r - offsets[lo])];
  }
}

// One scratch when the session is created: every pair's kept boxes
// [pairs * n], their counts [pairs] and the pairs' first rows [pairs + 1].
std::shared_ptr<const void> prepareNms(const PrepareContext &p) {
  const TensorView &scores = p.kernel.inputs[1];
  if (scores.rank() != 3) return nullptr;
  const size_t pairs = size_t(scores.dims[0] * scores.dims[1]);
  return deviceScratch((pairs * size_t(scores.dims[2]) + 2 * pairs + 1) * sizeof(int64_t));
}

// Optional scalar operand i on the device, or null when absent or empty.
template <typename T> const T *optionalScalar(const KernelContext &c, size_t i) {
  return c.hasInput(i) && c.inputs[i].data && c.inputs[i].numElements() > 0 ? c.inputs[i].as<T>() : nullptr;
}

Status NonMaxSuppressionKernel(const KernelContext &c) {
  const TensorView &boxes = c.inputs[0], &scores = c.inputs[1], &selected = c.outputs[0];
  if (boxes.rank() != 3 || scores.rank() != 3 || boxes.dims[2] != 4 || boxes.dims[0] != scores.dims[0] ||
      boxes.dims[1] != scores.dims[2])
    return sdError("NonMaxSuppression: boxes ", formatDims(boxes.dims), " do not match scores ",
                   formatDims(scores.dims));
  if (scores.dims[2] >= (int64_t(1) << 32) || scores.dims[0] * scores.dims[1] >= (int64_t(1) << 31))
    return sdError("NonMaxSuppression on CUDA takes under 2^32 boxes and 2^31 (batch, class) pairs");
  if (c.hasInput(2) && c.inputs[2].data && c.inputs[2].dtype != DType::I64)
    return sdError("NonMaxSuppression max_output_boxes_per_class must be i64");
  const DeviceScratch *scratch = scratchOf(c);
  if (!scratch) return sdError("NonMaxSuppression on CUDA: cannot allocate its scratch");
  const NmsGeometry g{scores.dims[0],
                      scores.dims[1],
                      scores.dims[2],
                      selected.dims[0],
                      c.attrs.getInt("center_point_box", 0) != 0,
                      optionalScalar<int64_t>(c, 2),
                      optionalScalar<float>(c, 3),
                      optionalScalar<float>(c, 4)};
  const int64_t pairs = g.batches * g.classes;
  int64_t *kept = scratch->as<int64_t>(), *keptCount = kept + pairs * g.n, *offsets = keptCount + pairs;
  cudaStream_t stream = streamOf(c);
  if (pairs > 0)
    selectPerClassKernel<<<unsigned(pairs), kNmsThreads, 0, stream>>>(
        g, boxes.as<float>(), scores.as<float>(), kept, keptCount);
  placeRowsKernel<<<1, kNmsThreads, 0, stream>>>(g, kept, keptCount, offsets,
                                                 selected.as<int64_t>(), c.outputs[1].as<int64_t>());
  return launchStatus("NonMaxSuppression");
}

} // namespace

void registerNonMaxSuppressionKernels() {
  registerKernel("NonMaxSuppression", NonMaxSuppressionKernel, {DType::F32}, prepareNms);
}

} // namespace sd::cuda
