// CUDA kernels of the Reduce family (Sum, Mean, Max, Min, SumSquare, L1, L2,
// LogSum, Prod, LogSumExp) and ArgMax/ArgMin: one
// block per output element, the block's threads striding over the reduced
// elements, a fixed-order block reduction (f64 accumulation for floats), so
// results do not depend on scheduling; for a few reduced elements per
// output, one thread per output summing them in order; for leading axes
// reduced over trailing ones kept (a bias gradient's sum over rows), column
// sums over fixed chunks of rows, then the chunks in order. Axes are read
// when the session is created (sd/ops/index_geometry.h, as the CPU kernels
// read them).
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "sd/ops/index_geometry.h"
#include <cmath>
#include <memory>

namespace sd::cuda {
namespace {

enum class Reduce { Sum, Mean, Max, Min, SumSquare, L1, L2, LogSum, Prod };

// At most this many reduced elements per output: one thread per output (below).
constexpr int64_t kFewReduced = 64;

struct ReduceGeometry {
  int keptRank = 0, reducedRank = 0;
  int64_t keptDims[kMaxRank] = {}, keptStrides[kMaxRank] = {};
  int64_t reducedDims[kMaxRank] = {}, reducedStrides[kMaxRank] = {};
  int64_t reducedCount = 1;
};

// Rows per chunk of a column reduction: a 8192-row gradient gives 128
// chunks, threads enough to fill the GPU with coalesced row reads.
constexpr int64_t kColumnChunkRows = 64;

struct ReducePrepared : PreparedError {
  ReduceGeometry g;
  // Set when leading axes are reduced over trailing ones kept: x is
  // [g.reducedCount rows, outputs columns], summed through these
  // [chunks][columns] f64 partials (the column path).
  double *partials = nullptr;
  ~ReducePrepared() { cudaFree(partials); }
};

// The geometry; with `columnPath`, also the partials of the column path
// where it applies (ReduceLogSumExp's kernel has no column path).
std::shared_ptr<ReducePrepared> prepareGeometry(const PrepareContext &p, bool columnPath) {
  auto s = std::make_shared<ReducePrepared>();
  const TensorView &x = p.kernel.inputs[0];
  std::vector<int64_t> axes;
  if (!hostIntegers(p, 1, axes)) {
    s->error = "a Reduce op on CUDA needs constant axes";
    return s;
  }
  if (x.rank() > kMaxRank) {
    s->error = "a Reduce op on CUDA takes up to rank 8";
    return s;
  }
  std::vector<bool> red = reducedAxes(x.rank(), axes, p.kernel.attrs.getInt("noop_with_empty_axes", 0) != 0);
  ReduceGeometry &g = s->g;
  Dims strides = rowMajorStrides(x.dims);
  for (size_t d = 0; d < strides.size(); ++d) {
    if (red[d]) {
      g.reducedDims[g.reducedRank] = x.dims[d];
      g.reducedStrides[g.reducedRank++] = strides[d];
      g.reducedCount *= x.dims[d];
    } else {
      g.keptDims[g.keptRank] = x.dims[d];
      g.keptStrides[g.keptRank++] = strides[d];
    }
  }
  // The column path: every reduced axis before every kept one, many rows, a row wide enough to coalesce.
  bool leading = true;
  for (size_t d = 1; d < red.size(); ++d) leading = leading && !(red[d] && !red[d - 1]);
  const int64_t columns = x.numElements() / std::max<int64_t>(g.reducedCount, 1);
  if (columnPath && leading && g.keptRank > 0 && g.reducedRank > 0 && g.reducedCount > kFewReduced && columns >= 32) {
    const int64_t chunks = (g.reducedCount + kColumnChunkRows - 1) / kColumnChunkRows;
    if (cudaMalloc(&s->partials, size_t(chunks * columns) * sizeof(double)) != cudaSuccess) {
      cudaGetLastError();
      s->partials = nullptr; // the block kernel instead
    }
  }
  return s;
}

std::shared_ptr<const void> prepareReduce(const PrepareContext &p) { return prepareGeometry(p, true); }
std::shared_ptr<const void> prepareLogSumExp(const PrepareContext &p) { return prepareGeometry(p, false); }

// The step's prepared geometry, or why there is none.
StatusOr<const ReducePrepared *> preparedReduce(const KernelContext &c) {
  auto *s = static_cast<const ReducePrepared *>(c.prepared);
  if (!s) return sdError("the Reduce op was not prepared");
  if (!s->error.empty()) return sdError(s->error);
  return s;
}

template <Reduce K, typename A> __device__ inline A identityOf() {
  if constexpr (K == Reduce::Max) return A(-INFINITY);
  else if constexpr (K == Reduce::Min) return A(INFINITY);
  else if constexpr (K == Reduce::Prod) return A(1);
  else return A(0);
}

struct MinOp {
  template <typename T> __device__ T operator()(T a, T b) const { return a < b || a != a ? a : b; }
};
struct ProdOp {
  template <typename T> __device__ T operator()(T a, T b) const { return a * b; }
};

// The memory offset of the i-th element (row-major) of a strided index space:
// where output o's reduced elements start (kept dims), and where the r-th of
// them sits from there (reduced dims).
__device__ inline int64_t offsetOf(const int64_t *dims, const int64_t *strides, int rank, int64_t i) {
  int64_t off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}
__device__ inline int64_t keptOffset(const ReduceGeometry &g, int64_t o) {
  return offsetOf(g.keptDims, g.keptStrides, g.keptRank, o);
}
__device__ inline int64_t reducedOffset(const ReduceGeometry &g, int64_t r) {
  return offsetOf(g.reducedDims, g.reducedStrides, g.reducedRank, r);
}

template <Reduce K, typename A> __device__ inline A fold(A acc, A v) {
  if constexpr (K == Reduce::Max) return MaxOp()(acc, v);
  else if constexpr (K == Reduce::Min) return MinOp()(acc, v);
  else if constexpr (K == Reduce::SumSquare || K == Reduce::L2) return acc + v * v;
  else if constexpr (K == Reduce::L1) return acc + (v < A(0) ? -v : v);
  else if constexpr (K == Reduce::Prod) return acc * v;
  else return acc + v;
}

template <Reduce K, typename A> __device__ inline A finish(A acc, int64_t count) {
  if constexpr (K == Reduce::Mean) return count ? acc / A(count) : A(NAN);
  else if constexpr (K == Reduce::L2) return std::sqrt(acc);
  else if constexpr (K == Reduce::LogSum) return std::log(acc);
  else return acc;
}

// One block per output element, its threads striding over the reduced elements.
template <Reduce K, typename T, typename A>
__global__ void reduceKernel(ReduceGeometry g, const T *x, T *y, int64_t outputs) {
  for (int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    const int64_t base = keptOffset(g, o);
    A acc = identityOf<K, A>();
    for (int64_t r = threadIdx.x; r < g.reducedCount; r += blockDim.x)
      acc = fold<K>(acc, A(load(x[base + reducedOffset(g, r)])));
    if constexpr (K == Reduce::Max) acc = blockReduce(acc, MaxOp(), identityOf<K, A>());
    else if constexpr (K == Reduce::Min) acc = blockReduce(acc, MinOp(), identityOf<K, A>());
    else if constexpr (K == Reduce::Prod) acc = blockReduce(acc, ProdOp(), A(1));
    else acc = blockReduce(acc, SumOp(), A(0));
    if (threadIdx.x == 0) y[o] = store<T>(Compute<T>(finish<K>(acc, g.reducedCount)));
  }
}

// A few reduced elements per output (the gradient of grouped-query
// attention's K/V repeat sums 3 heads into 1 over 8x4x1024x64 outputs): one
// thread per output, in order. The block kernel would keep 256 threads per
// output for 3 elements of work (40% of a Llama-small LoRA step on an H200).

template <Reduce K, typename T, typename A>
__global__ void reduceFewKernel(ReduceGeometry g, const T *x, T *y, int64_t outputs) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < outputs; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = keptOffset(g, o);
    A acc = identityOf<K, A>();
    for (int64_t r = 0; r < g.reducedCount; ++r) acc = fold<K>(acc, A(load(x[base + reducedOffset(g, r)])));
    y[o] = store<T>(Compute<T>(finish<K>(acc, g.reducedCount)));
  }
}

// Column sums of x [rows, columns] over each chunk of rows, in row order,
// one thread per (chunk, column): neighbouring threads read neighbouring columns.
template <Reduce K, typename T, typename A>
__global__ void reduceColumnChunksKernel(const T *x, int64_t rows, int64_t columns, double *partials) {
  const int64_t chunks = (rows + kColumnChunkRows - 1) / kColumnChunkRows;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < chunks * columns;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t chunk = t / columns, column = t % columns;
    A acc = identityOf<K, A>();
    for (int64_t r = chunk * kColumnChunkRows; r < rows && r < (chunk + 1) * kColumnChunkRows; ++r)
      acc = fold<K>(acc, A(load(x[r * columns + column])));
    partials[t] = double(acc);
  }
}

// Each column's chunk partials combined in chunk order.
template <Reduce K, typename T, typename A>
__global__ void reduceColumnFinishKernel(const double *partials, int64_t rows, int64_t columns, T *y) {
  const int64_t chunks = (rows + kColumnChunkRows - 1) / kColumnChunkRows;
  for (int64_t column = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; column < columns;
       column += int64_t(gridDim.x) * blockDim.x) {
    A acc = identityOf<K, A>();
    for (int64_t k = 0; k < chunks; ++k) {
      const A part = A(partials[k * columns + column]);
      if constexpr (K == Reduce::Max) acc = MaxOp()(acc, part);
      else if constexpr (K == Reduce::Min) acc = MinOp()(acc, part);
      else if constexpr (K == Reduce::Prod) acc = acc * part;
      else acc = acc + part; // SumSquare's, L1's and L2's chunks hold their sums already
    }
    y[column] = store<T>(Compute<T>(finish<K>(acc, rows)));
  }
}

// ReduceLogSumExp: a block per output, the CPU's two passes: the maximum m
// (0 where it is not finite), then log(sum exp(x - m)) + m, all in f64.
template <typename T>
__global__ void logSumExpKernel(ReduceGeometry g, const T *x, T *y, int64_t outputs) {
  for (int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    const int64_t base = keptOffset(g, o);
    double m = -INFINITY;
    for (int64_t r = threadIdx.x; r < g.reducedCount; r += blockDim.x)
      m = MaxOp()(m, double(load(x[base + reducedOffset(g, r)])));
    m = blockReduce(m, MaxOp(), double(-INFINITY));
    if (!isfinite(m)) m = 0;
    double sum = 0;
    for (int64_t r = threadIdx.x; r < g.reducedCount; r += blockDim.x)
      sum += std::exp(double(load(x[base + reducedOffset(g, r)])) - m);
    sum = blockReduce(sum, SumOp(), 0.0);
    if (threadIdx.x == 0) y[o] = store<T>(Compute<T>(std::log(sum) + m));
  }
}

Status logSumExpOp(const KernelContext &c) {
  StatusOr<const ReducePrepared *> prepared = preparedReduce(c);
  if (!prepared.isOk()) return prepared.status();
  const ReducePrepared *s = prepared.value();
  const int64_t outputs = c.outputs[0].numElements();
  if (outputs == 0) return Status::ok();
  return dispatchFloatStorage(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    logSumExpKernel<T><<<rowBlocks(outputs), kThreads, 0, streamOf(c)>>>(
        s->g, c.inputs[0].as<T>(), c.outputs[0].as<T>(), outputs);
    return launchStatus("ReduceLogSumExp");
  });
}

template <Reduce K> Status reduceOp(const KernelContext &c) {
  StatusOr<const ReducePrepared *> prepared = preparedReduce(c);
  if (!prepared.isOk()) return prepared.status();
  const ReducePrepared *s = prepared.value();
  int64_t outputs = c.outputs[0].numElements();
  if (outputs == 0) return Status::ok();
  const bool few = s->g.reducedCount <= kFewReduced;
  const unsigned blocks = few ? blocksFor(outputs) : rowBlocks(outputs);
  return dispatchFloatStorage(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if (s->partials) {
      const int64_t rows = s->g.reducedCount, chunks = (rows + kColumnChunkRows - 1) / kColumnChunkRows;
      reduceColumnChunksKernel<K, T, double><<<blocksFor(chunks * outputs), kThreads, 0, streamOf(c)>>>(
          c.inputs[0].as<T>(), rows, outputs, s->partials);
      reduceColumnFinishKernel<K, T, double><<<blocksFor(outputs), kThreads, 0, streamOf(c)>>>(
          s->partials, rows, outputs, c.outputs[0].as<T>());
    } else if (few)
      reduceFewKernel<K, T, double><<<blocks, kThreads, 0, streamOf(c)>>>(s->g, c.inputs[0].as<T>(),
                                                                          c.outputs[0].as<T>(), outputs);
    else
      reduceKernel<K, T, double><<<blocks, kThreads, 0, streamOf(c)>>>(s->g, c.inputs[0].as<T>(),
                                                                        c.outputs[0].as<T>(), outputs);
    return launchStatus("Reduce");
  });
}

// ArgMax/ArgMin: one thread per output scanning its axis in order, the CPU
// kernel's loop exactly (the first index of the extreme value, the last with
// select_last_index; a NaN wins only at index 0, where nothing beats it).
template <bool IsMax, typename T>
__global__ void argKernel(const T *x, int64_t *y, int64_t outer, int64_t n, int64_t inner, bool last) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < outer * inner;
       o += int64_t(gridDim.x) * blockDim.x) {
    const T *p = x + (o / inner) * n * inner + o % inner;
    int64_t best = 0;
    Compute<T> b = load(p[0]);
    for (int64_t j = 1; j < n; ++j) {
      const Compute<T> v = load(p[j * inner]);
      if (IsMax ? (v > b || (last && v == b)) : (v < b || (last && v == b))) {
        best = j;
        b = v;
      }
    }
    y[o] = best;
  }
}

template <bool IsMax> Status argOp(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank()) return sdError("ArgMax/ArgMin: axis out of range");
  const AxisExtent ext = extentAround(x.dims, axis);
  if (ext.len <= 0) return sdError("ArgMax/ArgMin over an empty axis");
  const int64_t outputs = ext.outer * ext.inner;
  if (outputs == 0) return Status::ok();
  const bool last = c.attrs.getInt("select_last_index", 0) != 0;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    argKernel<IsMax, T><<<blocksFor(outputs), kThreads, 0, streamOf(c)>>>(x.as<T>(), c.outputs[0].as<int64_t>(),
                                                                          ext.outer, ext.len, ext.inner, last);
    return launchStatus(IsMax ? "ArgMax" : "ArgMin");
  };
  if (x.dtype == DType::I64) return launch(int64_t{});
  if (x.dtype == DType::I32) return launch(int32_t{});
  return dispatchFloatStorage(x.dtype, launch);
}

} // namespace

void registerReduceKernels() {
  registerKernel("ReduceSum", reduceOp<Reduce::Sum>, floatStorage(), prepareReduce);
  registerKernel("ReduceMean", reduceOp<Reduce::Mean>, floatStorage(), prepareReduce);
  registerKernel("ReduceMax", reduceOp<Reduce::Max>, floatStorage(), prepareReduce);
  registerKernel("ReduceMin", reduceOp<Reduce::Min>, floatStorage(), prepareReduce);
  registerKernel("ReduceSumSquare", reduceOp<Reduce::SumSquare>, floatStorage(), prepareReduce);
  registerKernel("ReduceL1", reduceOp<Reduce::L1>, floatStorage(), prepareReduce);
  registerKernel("ReduceL2", reduceOp<Reduce::L2>, floatStorage(), prepareReduce);
  registerKernel("ReduceLogSum", reduceOp<Reduce::LogSum>, floatStorage(), prepareReduce);
  registerKernel("ReduceProd", reduceOp<Reduce::Prod>, floatStorage(), prepareReduce);
  registerKernel("ReduceLogSumExp", logSumExpOp, floatStorage(), prepareLogSumExp);
  const TypeSet arg = floatStorage() | TypeSet{DType::I64, DType::I32};
  registerKernel("ArgMax", argOp<true>, arg, nullptr, 0, TypeSet{DType::I64});
  registerKernel("ArgMin", argOp<false>, arg, nullptr, 0, TypeSet{DType::I64});
}

} // namespace sd::cuda
