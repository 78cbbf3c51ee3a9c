// CUDA kernels that scan or mask values (see kernels/cpu/generators.cc):
// CumSum and CumProd, one thread per line along the axis adding in the CPU
// kernel's order (so the bits match it, and no scan tree depends on the
// launch); Trilu. Their axis and k operands are constants, read when the
// session is created: the host cannot look at device values without a sync.
#include "cuda_util.cuh"
#include "sd/ops/dispatch.h"
#include "sd/ops/index_geometry.h"
#include <memory>

namespace sd::cuda {
namespace {

// A constant scalar integer operand, read at prepare (CumSum's axis, Trilu's k).
struct ScalarPrepared : PreparedError {
  int64_t value = 0;
};

std::shared_ptr<const void> prepareScalar(const PrepareContext &p, size_t operand, int64_t absent, const char *what) {
  auto s = std::make_shared<ScalarPrepared>();
  std::vector<int64_t> v;
  if (!hostIntegers(p, operand, v)) s->error = std::string(what) + " on CUDA must be a constant";
  else if (v.size() > 1) s->error = std::string(what) + " must be a single integer";
  else s->value = v.empty() ? absent : v[0];
  return s;
}

StatusOr<int64_t> preparedScalar(const KernelContext &c, const char *op) {
  auto *s = static_cast<const ScalarPrepared *>(c.prepared);
  if (!s) return sdError(op, " was not prepared");
  if (!s->error.empty()) return sdError(op, ": ", s->error);
  return s->value;
}

template <bool Product, typename T>
__global__ void cumulativeKernel(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, bool exclusive,
                                 bool reverse) {
  for (int64_t line = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; line < outer * inner;
       line += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (line / inner) * n * inner + line % inner;
    Compute<T> acc = Compute<T>(Product ? 1 : 0);
    for (int64_t jj = 0; jj < n; ++jj) {
      const int64_t off = base + (reverse ? n - 1 - jj : jj) * inner;
      const Compute<T> v = load(x[off]);
      if (exclusive) y[off] = store<T>(acc);
      acc = Product ? acc * v : acc + v;
      if (!exclusive) y[off] = store<T>(acc);
    }
  }
}

template <bool Product> Status cumulative(const KernelContext &c) {
  const char *op = Product ? "CumProd" : "CumSum";
  StatusOr<int64_t> axisOr = preparedScalar(c, op);
  if (!axisOr.isOk()) return axisOr.status();
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t axis = axisOr.value();
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank()) return sdError(op, " axis out of range");
  const AxisExtent ext = extentAround(x.dims, axis);
  const int64_t lines = ext.outer * ext.inner;
  if (lines == 0 || ext.len == 0) return Status::ok();
  const bool exclusive = c.attrs.getInt("exclusive", 0) != 0, reverse = c.attrs.getInt("reverse", 0) != 0;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    cumulativeKernel<Product, T><<<blocksFor(lines), kThreads, 0, streamOf(c)>>>(
        x.as<T>(), y.as<T>(), ext.outer, ext.len, ext.inner, exclusive, reverse);
    return launchStatus(op);
  };
  if (x.dtype == DType::I64) return launch(int64_t{});
  if (x.dtype == DType::I32) return launch(int32_t{});
  return dispatchFloatStorage(x.dtype, launch);
}

std::shared_ptr<const void> prepareCumulative(const PrepareContext &p) { return prepareScalar(p, 1, 0, "the axis"); }

// Trilu: elements on the kept side of diagonal k copied, the rest zero.
template <typename U>
__global__ void triluKernel(const U *x, U *y, int64_t n, int64_t rows, int64_t cols, int64_t k, bool upper) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = i % cols, row = (i / cols) % rows;
    const bool keep = upper ? col - row >= k : col - row <= k;
    y[i] = keep ? x[i] : U{};
  }
}

Status TriluKernel(const KernelContext &c) {
  StatusOr<int64_t> k = preparedScalar(c, "Trilu");
  if (!k.isOk()) return k.status();
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  if (x.rank() < 2) return sdError("Trilu needs a tensor of rank 2 or more");
  const int64_t n = y.numElements(), rows = x.dims[size_t(x.rank() - 2)], cols = x.dims.back();
  if (n == 0) return Status::ok();
  const bool upper = c.attrs.getInt("upper", 1) != 0;
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    triluKernel<U><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(x.as<U>(), y.as<U>(), n, rows, cols, k.value(), upper);
    return launchStatus("Trilu");
  });
}

std::shared_ptr<const void> prepareTrilu(const PrepareContext &p) { return prepareScalar(p, 1, 0, "Trilu's k"); }

} // namespace

void registerGeneratorKernels() {
  const TypeSet scanned = floatStorage() | TypeSet{DType::I64, DType::I32};
  registerKernel("CumSum", cumulative<false>, scanned, prepareCumulative);
  registerKernel("CumProd", cumulative<true>, scanned, prepareCumulative);
  registerKernel("Trilu", TriluKernel, TypeSet::all(), prepareTrilu);
}

} // namespace sd::cuda
