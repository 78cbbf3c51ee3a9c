// CUDA kernels of NonZero and Compress (see kernels/cpu/selection.cc): the
// selection is written to the front of results the plan sized for the most it
// can select, the rest is zero, and the last result counts the real slices.
// One block walks the operand in order, tile by tile, placing each kept
// element by a block-wide prefix sum of the tile's flags: the CPU's order,
// no atomics, the same bits on every replay. One block bounds the speed
// (a million elements take about a thousand tiles), which suits the masks
// and score filters these ops see. A selection larger than its buffers
// cannot be refused mid-step: the kernel fills the buffers and stores the
// real count, and the session refuses that count when it trims the result.
// Unique (a sort) stays on the CPU.
#include "cuda_util.cuh"
#include "sd/ops/dispatch.h"
#include "sd/ops/index_geometry.h"
#include <memory>

namespace sd::cuda {
namespace {

constexpr int kScanThreads = 1024, kScanItems = 4, kTile = kScanThreads * kScanItems;

// Exclusive prefix sum of every thread's `v` in thread order; `total` gets
// the block's sum. Called by every thread of a kScanThreads block.
__device__ int64_t blockExclusiveScan(int64_t v, int64_t &total) {
  __shared__ int64_t warpSums[kScanThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = kScanThreads / 32;
  int64_t inclusive = v;
  for (int off = 1; off < 32; off <<= 1) {
    const int64_t before = __shfl_up_sync(0xffffffffu, inclusive, off);
    if (lane >= off) inclusive += before;
  }
  if (lane == 31) warpSums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int64_t s = lane < warps ? warpSums[lane] : 0;
    for (int off = 1; off < 32; off <<= 1) {
      const int64_t before = __shfl_up_sync(0xffffffffu, s, off);
      if (lane >= off) s += before;
    }
    if (lane < warps) warpSums[lane] = s;
  }
  __syncthreads();
  const int64_t exclusive = (warp ? warpSums[warp - 1] : 0) + inclusive - v;
  total = warpSums[warps - 1];
  __syncthreads(); // warpSums is reused by the next tile's scan
  return exclusive;
}

// Whether an element (its bits, as wide an unsigned type U) is not zero:
// floats ignore the sign bit, so -0 is zero and NaN is not, as on the CPU.
template <typename U> struct NonzeroBits {
  U mask;
  __device__ bool operator()(U bits) const { return (bits & mask) != 0; }
};
template <typename U> NonzeroBits<U> nonzeroBits(DType t) {
  const bool isFloat = t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
  return {isFloat ? U(~(U(1) << (8 * sizeof(U) - 1))) : U(~U(0))};
}

// Calls emit(k, i) for the k-th element i in [0, n) that `keep` flags, in
// order, and returns how many it flagged (every thread gets the count).
template <typename Keep, typename Emit> __device__ int64_t selectInOrder(int64_t n, Keep keep, Emit emit) {
  int64_t base = 0;
  for (int64_t tile = 0; tile < n; tile += kTile) {
    const int64_t first = tile + int64_t(threadIdx.x) * kScanItems;
    bool kept[kScanItems];
    int64_t mine = 0;
    for (int j = 0; j < kScanItems; ++j) {
      kept[j] = first + j < n && keep(first + j);
      mine += kept[j] ? 1 : 0;
    }
    int64_t total;
    int64_t at = base + blockExclusiveScan(mine, total);
    for (int j = 0; j < kScanItems; ++j)
      if (kept[j]) emit(at++, first + j);
    base += total;
  }
  return base;
}

template <typename U> struct ElementIsNonzero {
  const U *x;
  NonzeroBits<U> nonzero;
  __device__ bool operator()(int64_t i) const { return nonzero(x[i]); }
};

// y[d, k] = coordinate d of the k-th nonzero element (row-major), k < capacity.
struct WriteCoordinates {
  Shape8 dims;
  int64_t *y, capacity;
  __device__ void operator()(int64_t k, int64_t i) const {
    if (k >= capacity) return;
    for (int d = dims.rank - 1; d >= 0; --d) {
      y[d * capacity + k] = i % dims.dims[d];
      i /= dims.dims[d];
    }
  }
};

template <typename U>
__global__ void nonZeroKernel(ElementIsNonzero<U> keep, int64_t n, WriteCoordinates write, int64_t *count) {
  const int64_t kept = selectInOrder(n, keep, write);
  if (threadIdx.x == 0) *count = kept;
}

Status NonZeroKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  if (x.rank() > kMaxRank) return sdError("NonZero on CUDA takes up to rank ", kMaxRank);
  WriteCoordinates write{Shape8{int(x.rank()), {}}, y.as<int64_t>(), y.dims[1]};
  for (int d = 0; d < write.dims.rank; ++d) write.dims.dims[d] = x.dims[size_t(d)];
  cudaStream_t stream = streamOf(c);
  SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(y.data, 0, y.byteSize(), stream), "NonZero"));
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    nonZeroKernel<U><<<1, kScanThreads, 0, stream>>>({x.as<U>(), nonzeroBits<U>(x.dtype)}, x.numElements(), write,
                                                      c.outputs.back().as<int64_t>());
    return launchStatus("NonZero");
  });
}

// Compress: x as [outer, extent, inner] slices (its flattened elements when
// there is no axis); y holds `capacity` slices.
struct CompressGeometry {
  int64_t outer, extent, inner, capacity, considered; // considered: min(len(condition), extent)
};

StatusOr<CompressGeometry> compressGeometry(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &cond = c.inputs[1], &y = c.outputs[0];
  if (cond.rank() != 1) return sdError("Compress condition must be 1-D, got ", formatDims(cond.dims));
  CompressGeometry g{1, x.numElements(), 1, y.numElements(), 0};
  if (c.attrs.has("axis")) {
    int64_t axis = c.attrs.getInt("axis", 0);
    if (axis < 0) axis += x.rank();
    if (axis < 0 || axis >= x.rank()) return sdError("Compress axis ", c.attrs.getInt("axis", 0), " is outside rank ", x.rank());
    const AxisExtent e = extentAround(x.dims, axis);
    g = {e.outer, e.len, e.inner, y.dims[size_t(axis)], 0};
  }
  g.considered = std::min(cond.dims[0], g.extent);
  return g;
}

// The kept positions along the axis, in order, go to `kept` (room for extent).
struct WritePosition {
  int64_t *kept;
  __device__ void operator()(int64_t k, int64_t i) const { kept[k] = i; }
};

template <typename C>
__global__ void compressSelectKernel(ElementIsNonzero<C> keep, int64_t considered, int64_t *kept, int64_t *count) {
  const int64_t n = selectInOrder(considered, keep, WritePosition{kept});
  if (threadIdx.x == 0) *count = n;
}

// y's slice k is x's slice kept[k] for k < count, zero after.
template <typename U>
__global__ void compressCopyKernel(CompressGeometry g, const U *x, const int64_t *kept, const int64_t *count, U *y) {
  const int64_t n = g.outer * g.capacity * g.inner, real = *count < g.capacity ? *count : g.capacity;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i % g.inner, k = (i / g.inner) % g.capacity, o = i / (g.inner * g.capacity);
    y[i] = k < real ? x[(o * g.extent + kept[k]) * g.inner + e] : U(0);
  }
}

// Room for the kept positions, allocated when the session is created.
std::shared_ptr<const void> prepareCompress(const PrepareContext &p) {
  StatusOr<CompressGeometry> g = compressGeometry(p.kernel);
  if (!g.isOk()) return nullptr;
  return deviceScratch(size_t(g.value().considered) * sizeof(int64_t));
}

Status CompressKernel(const KernelContext &c) {
  StatusOr<CompressGeometry> g = compressGeometry(c);
  if (!g.isOk()) return g.status();
  const DeviceScratch *scratch = scratchOf(c);
  if (!scratch) return sdError("Compress on CUDA: cannot allocate room for ", g.value().considered, " positions");
  int64_t *kept = scratch->as<int64_t>();
  const TensorView &x = c.inputs[0], &cond = c.inputs[1], &y = c.outputs[0];
  int64_t *count = c.outputs.back().as<int64_t>();
  cudaStream_t stream = streamOf(c);
  SD_RETURN_IF_ERROR(dispatchByWidth(cond.dtype, [&](auto tag) {
    using C = decltype(tag);
    compressSelectKernel<C><<<1, kScanThreads, 0, stream>>>({cond.as<C>(), nonzeroBits<C>(cond.dtype)},
                                                            g.value().considered, kept, count);
    return launchStatus("Compress");
  }));
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    compressCopyKernel<U><<<blocksFor(n), kThreads, 0, stream>>>(*g, x.as<U>(), kept, count, y.as<U>());
    return launchStatus("Compress");
  });
}

} // namespace

void registerSelectionKernels() {
  registerKernel("NonZero", NonZeroKernel, TypeSet::all());
  registerKernel("Compress", CompressKernel, TypeSet::all(), prepareCompress);
}

} // namespace sd::cuda
