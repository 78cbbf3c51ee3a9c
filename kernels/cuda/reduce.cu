// CUDA kernels of the Reduce family (Sum, Mean, Max, Min, SumSquare): one
// block per output element, the block's threads striding over the reduced
// elements, a fixed-order block reduction (f64 accumulation for floats), so
// results do not depend on scheduling. Axes are read when the session is
// created (sd/ops/index_geometry.h, as the CPU kernels read them).
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "sd/ops/index_geometry.h"
#include <cmath>
#include <memory>

namespace sd::cuda {
namespace {

enum class Reduce { Sum, Mean, Max, Min, SumSquare };

struct ReduceGeometry {
  int keptRank = 0, reducedRank = 0;
  int64_t keptDims[kMaxRank] = {}, keptStrides[kMaxRank] = {};
  int64_t reducedDims[kMaxRank] = {}, reducedStrides[kMaxRank] = {};
  int64_t reducedCount = 1;
};

struct ReducePrepared : PreparedError {
  ReduceGeometry g;
};

std::shared_ptr<const void> prepareReduce(const PrepareContext &p) {
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
  return s;
}

template <Reduce K, typename A> __device__ inline A identityOf() {
  if constexpr (K == Reduce::Max) return A(-INFINITY);
  else if constexpr (K == Reduce::Min) return A(INFINITY);
  else return A(0);
}

struct MinOp {
  template <typename T> __device__ T operator()(T a, T b) const { return a < b || a != a ? a : b; }
};

template <Reduce K, typename T, typename A>
__global__ void reduceKernel(ReduceGeometry g, const T *x, T *y, int64_t outputs) {
  for (int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    int64_t rem = o, base = 0;
    for (int d = g.keptRank - 1; d >= 0; --d) {
      base += (rem % g.keptDims[d]) * g.keptStrides[d];
      rem /= g.keptDims[d];
    }
    A acc = identityOf<K, A>();
    for (int64_t r = threadIdx.x; r < g.reducedCount; r += blockDim.x) {
      int64_t rr = r, off = base;
      for (int d = g.reducedRank - 1; d >= 0; --d) {
        off += (rr % g.reducedDims[d]) * g.reducedStrides[d];
        rr /= g.reducedDims[d];
      }
      A v = A(load(x[off]));
      if constexpr (K == Reduce::Max) acc = MaxOp()(acc, v);
      else if constexpr (K == Reduce::Min) acc = MinOp()(acc, v);
      else if constexpr (K == Reduce::SumSquare) acc += v * v;
      else acc += v;
    }
    if constexpr (K == Reduce::Max) acc = blockReduce(acc, MaxOp(), identityOf<K, A>());
    else if constexpr (K == Reduce::Min) acc = blockReduce(acc, MinOp(), identityOf<K, A>());
    else acc = blockReduce(acc, SumOp(), A(0));
    if (threadIdx.x == 0) {
      if constexpr (K == Reduce::Mean) acc = g.reducedCount ? acc / A(g.reducedCount) : A(NAN);
      y[o] = store<T>(Compute<T>(acc));
    }
  }
}

template <Reduce K> Status reduceOp(const KernelContext &c) {
  auto *s = static_cast<const ReducePrepared *>(c.prepared);
  if (!s) return sdError("the Reduce op was not prepared");
  if (!s->error.empty()) return sdError(s->error);
  int64_t outputs = c.outputs[0].numElements();
  if (outputs == 0) return Status::ok();
  unsigned blocks = unsigned(std::min<int64_t>(outputs, int64_t(1) << 20));
  return dispatchFloatStorage(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    reduceKernel<K, T, double><<<blocks, kThreads, 0, streamOf(c)>>>(s->g, c.inputs[0].as<T>(),
                                                                      c.outputs[0].as<T>(), outputs);
    return launchStatus("Reduce");
  });
}

} // namespace

void registerReduceKernels() {
  registerKernel("ReduceSum", reduceOp<Reduce::Sum>, floatStorage(), prepareReduce);
  registerKernel("ReduceMean", reduceOp<Reduce::Mean>, floatStorage(), prepareReduce);
  registerKernel("ReduceMax", reduceOp<Reduce::Max>, floatStorage(), prepareReduce);
  registerKernel("ReduceMin", reduceOp<Reduce::Min>, floatStorage(), prepareReduce);
  registerKernel("ReduceSumSquare", reduceOp<Reduce::SumSquare>, floatStorage(), prepareReduce);
}

} // namespace sd::cuda
