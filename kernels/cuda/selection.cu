// CUDA kernels of NonZero, Compress and Unique (see kernels/cpu/selection.cc): the
// selection is written to the front of results the plan sized for the most it
// can select, the rest is zero, and the last result counts the real slices.
// One block walks the operand in order, tile by tile, placing each kept
// element by a block-wide prefix sum of the tile's flags: the CPU's order,
// no atomics, the same bits on every replay. One block bounds the speed
// (a million elements take 245 tiles of 4096), which suits the masks
// and score filters these ops see. A selection larger than its buffers
// cannot be refused mid-step: the kernel fills the buffers and stores the
// real count, and the session refuses that count when it trims the result.
// Unique sorts slice indices with CUB's stable merge sort (the CPU's
// std::stable_sort order), then finds the groups of equal slices with the
// same block-wide scan.
#include "../shapes/selection.h"
#include "cuda_util.cuh"
#include "sd/ops/dispatch.h"
#include "sd/ops/index_geometry.h"
#include <cub/device/device_merge_sort.cuh>
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
  bool hasAxis;
  int64_t axis;
  SD_RETURN_IF_ERROR(selection::optionalAxis(c.attrs, x.rank(), hasAxis, axis));
  const AxisExtent e = selection::slicesOf(x.dims, hasAxis, axis);
  return CompressGeometry{e.outer, e.len, e.inner, hasAxis ? y.dims[size_t(axis)] : y.numElements(),
                          std::min(cond.dims[0], e.len)};
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

// Unique's slices: x as [outer, n, inner] (its flattened elements when there
// is no axis), compared element by element in order as the CPU compares
// them (numerically: -0 equals 0), whatever x's type, so one sort serves all.
struct Slices {
  const void *x;
  DType dtype;
  int64_t outer, n, inner;

  __device__ int compareElements(int64_t a, int64_t b) const {
    switch (dtype) {
    case DType::F32: return cmp(static_cast<const float *>(x)[a], static_cast<const float *>(x)[b]);
    case DType::F64: return cmp(static_cast<const double *>(x)[a], static_cast<const double *>(x)[b]);
    case DType::F16: return cmp(load(static_cast<const __half *>(x)[a]), load(static_cast<const __half *>(x)[b]));
    case DType::BF16:
      return cmp(load(static_cast<const __nv_bfloat16 *>(x)[a]), load(static_cast<const __nv_bfloat16 *>(x)[b]));
    case DType::I64: return cmp(static_cast<const int64_t *>(x)[a], static_cast<const int64_t *>(x)[b]);
    case DType::I32: return cmp(static_cast<const int32_t *>(x)[a], static_cast<const int32_t *>(x)[b]);
    case DType::I16: return cmp(static_cast<const int16_t *>(x)[a], static_cast<const int16_t *>(x)[b]);
    case DType::I8: return cmp(static_cast<const int8_t *>(x)[a], static_cast<const int8_t *>(x)[b]);
    case DType::U64: return cmp(static_cast<const uint64_t *>(x)[a], static_cast<const uint64_t *>(x)[b]);
    case DType::U32: return cmp(static_cast<const uint32_t *>(x)[a], static_cast<const uint32_t *>(x)[b]);
    case DType::U16: return cmp(static_cast<const uint16_t *>(x)[a], static_cast<const uint16_t *>(x)[b]);
    default: return cmp(static_cast<const uint8_t *>(x)[a], static_cast<const uint8_t *>(x)[b]); // u8, bool
    }
  }
  template <typename V> __device__ static int cmp(V p, V q) { return p != q ? (p < q ? -1 : 1) : 0; }

  // Slice a against slice b: -1 before, 0 equal, 1 after (the first element that differs decides).
  __device__ int compare(int64_t a, int64_t b) const {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const int c = compareElements((o * n + a) * inner + i, (o * n + b) * inner + i);
        if (c) return c;
      }
    return 0;
  }
};

struct SliceLess {
  Slices s;
  __device__ bool operator()(const int64_t &a, const int64_t &b) const { return s.compare(a, b) < 0; }
};

struct UniqueGeometry {
  Slices slices;
  int64_t capacity; // of y's slices
  bool sorted;
};

// Unique's scratch, carved from one block: the sorted slice order, the
// groups' first positions in it (+ n at the end), the number of groups, the
// first-occurrence marks and ranks (sorted = 0), then CUB's temporary storage.
struct UniqueScratch {
  int64_t *order, *heads, *groups, *marks, *rankAt;
  void *cub;
  size_t cubBytes;
};

size_t uniqueCubBytes(int64_t n) {
  size_t bytes = 0;
  cub::DeviceMergeSort::StableSortKeys(nullptr, bytes, static_cast<int64_t *>(nullptr), n, SliceLess{});
  return bytes;
}

UniqueScratch carveUnique(void *base, int64_t n) {
  int64_t *p = static_cast<int64_t *>(base);
  const size_t m = size_t(n);
  UniqueScratch u{p, p + m, p + 2 * m + 1, p + 2 * m + 2, p + 3 * m + 2, p + 4 * m + 2, uniqueCubBytes(n)};
  return u;
}

__global__ void iotaKernel(int64_t *order, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    order[i] = i;
}

// Positions of the sorted order where a new group of equal slices starts.
struct StartsGroup {
  Slices s;
  const int64_t *order;
  __device__ bool operator()(int64_t k) const { return k == 0 || s.compare(order[k - 1], order[k]) != 0; }
};
struct WriteHead {
  int64_t *heads;
  __device__ void operator()(int64_t h, int64_t k) const { heads[h] = k; }
};

__global__ void uniqueHeadsKernel(Slices s, const int64_t *order, int64_t *heads, int64_t *groups, int64_t *count) {
  const int64_t g = selectInOrder(s.n, StartsGroup{s, order}, WriteHead{heads});
  if (threadIdx.x == 0) heads[g] = s.n, *groups = g, *count = g;
}

// sorted = 0: groups rank by their first occurrence; the first occurrences
// are marked, and a scan over the slices in index order ranks them.
__global__ void markFirstsKernel(const int64_t *order, const int64_t *heads, const int64_t *groups, int64_t *marks,
                                 int64_t n) {
  for (int64_t h = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; h < *groups; h += int64_t(gridDim.x) * blockDim.x)
    marks[order[heads[h]]] = 1;
}
struct Marked {
  const int64_t *marks;
  __device__ bool operator()(int64_t i) const { return marks[i] != 0; }
};
struct WriteRank {
  int64_t *rankAt;
  __device__ void operator()(int64_t k, int64_t i) const { rankAt[i] = k; }
};
__global__ void rankFirstsKernel(const int64_t *marks, int64_t *rankAt, int64_t n) {
  selectInOrder(n, Marked{marks}, WriteRank{rankAt});
}

// One thread per sorted position k: its group h, the group's rank; inverse
// for the slice at k; a group's head writes y's slice, its first occurrence
// and its count.
template <typename U>
__global__ void uniqueOutputsKernel(UniqueGeometry g, UniqueScratch u, const U *x, U *y, int64_t *first,
                                    int64_t *inverse, int64_t *counts) {
  const Slices &s = g.slices;
  const int64_t groups = *u.groups;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < s.n; k += int64_t(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = groups - 1; // the last group starting at or before k
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (u.heads[mid] <= k) lo = mid;
      else hi = mid - 1;
    }
    const int64_t h = lo, slice = u.order[k], firstSlice = u.order[u.heads[h]];
    const int64_t rank = g.sorted ? h : u.rankAt[firstSlice];
    if (inverse) inverse[slice] = rank;
    if (k != u.heads[h] || rank >= g.capacity) continue;
    if (first) first[rank] = slice;
    if (counts) counts[rank] = u.heads[h + 1] - u.heads[h];
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i)
        y[(o * g.capacity + rank) * s.inner + i] = x[(o * s.n + slice) * s.inner + i];
  }
}

StatusOr<UniqueGeometry> uniqueGeometry(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  bool hasAxis;
  int64_t axis;
  SD_RETURN_IF_ERROR(selection::optionalAxis(c.attrs, x.rank(), hasAxis, axis));
  const AxisExtent e = selection::slicesOf(x.dims, hasAxis, axis);
  if (e.len >= (int64_t(1) << 31)) return sdError("Unique on CUDA sorts under 2^31 slices");
  return UniqueGeometry{{x.data, x.dtype, e.outer, e.len, e.inner},
                        hasAxis ? y.dims[size_t(axis)] : y.numElements(),
                        c.attrs.getInt("sorted", 1) != 0};
}

std::shared_ptr<const void> prepareUnique(const PrepareContext &p) {
  StatusOr<UniqueGeometry> g = uniqueGeometry(p.kernel);
  if (!g.isOk()) return nullptr;
  const int64_t n = g.value().slices.n;
  return deviceScratch(size_t(4 * n + 2) * sizeof(int64_t) + uniqueCubBytes(n));
}

Status UniqueKernel(const KernelContext &c) {
  StatusOr<UniqueGeometry> geometry = uniqueGeometry(c);
  if (!geometry.isOk()) return geometry.status();
  const DeviceScratch *scratch = scratchOf(c);
  if (!scratch) return sdError("Unique on CUDA: cannot allocate its scratch");
  const UniqueGeometry &g = geometry.value();
  const int64_t n = g.slices.n;
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  cudaStream_t stream = streamOf(c);
  int64_t *out[3] = {};
  for (size_t k = 1; k < 4; ++k)
    if (c.outputs[k].data) {
      out[k - 1] = c.outputs[k].as<int64_t>();
      SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(out[k - 1], 0, c.outputs[k].byteSize(), stream), "Unique"));
    }
  SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(y.data, 0, y.byteSize(), stream), "Unique"));
  int64_t *count = c.outputs.back().as<int64_t>();
  if (n == 0) return cudaCheck(cudaMemsetAsync(count, 0, sizeof(int64_t), stream), "Unique");
  const UniqueScratch u = carveUnique(scratch->data, n);
  iotaKernel<<<blocksFor(n), kThreads, 0, stream>>>(u.order, n);
  size_t cubBytes = u.cubBytes;
  SD_RETURN_IF_ERROR(cudaCheck(
      cub::DeviceMergeSort::StableSortKeys(u.cub, cubBytes, u.order, n, SliceLess{g.slices}, stream), "Unique's sort"));
  uniqueHeadsKernel<<<1, kScanThreads, 0, stream>>>(g.slices, u.order, u.heads, u.groups, count);
  if (!g.sorted) {
    SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(u.marks, 0, size_t(n) * sizeof(int64_t), stream), "Unique"));
    markFirstsKernel<<<blocksFor(n), kThreads, 0, stream>>>(u.order, u.heads, u.groups, u.marks, n);
    rankFirstsKernel<<<1, kScanThreads, 0, stream>>>(u.marks, u.rankAt, n);
  }
  SD_RETURN_IF_ERROR(launchStatus("Unique"));
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    uniqueOutputsKernel<U><<<blocksFor(n), kThreads, 0, stream>>>(g, u, x.as<U>(), y.as<U>(), out[0], out[1], out[2]);
    return launchStatus("Unique");
  });
}

} // namespace

void registerSelectionKernels() {
  registerKernel("NonZero", NonZeroKernel, TypeSet::all());
  registerKernel("Compress", CompressKernel, TypeSet::all(), prepareCompress);
  registerKernel("Unique", UniqueKernel, TypeSet::all(), prepareUnique);
}

} // namespace sd::cuda
