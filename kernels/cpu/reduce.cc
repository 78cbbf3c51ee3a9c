// CPU kernels for reductions and ArgMax/ArgMin. A reduction is viewed as
// [outer, reduced, inner] when its axes are contiguous, else as a gather over
// an index walk.
#include "cpu_util.h"
#include "sd/ops/index_geometry.h"
#include <algorithm>
#include <cmath>
#include <limits>

namespace sd::cpu {
namespace {

enum class RK { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

std::vector<bool> reducedAxesOf(const KernelContext &c, int64_t rank) {
  std::vector<int64_t> axes;
  if (c.hasInput(1) && c.inputs[1].data) readIntegers(c.inputs[1], axes);
  return reducedAxes(rank, axes, c.attrs.getInt("noop_with_empty_axes", 0) != 0);
}

template <typename T, RK K> Status reduceT(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  int64_t rank = x.rank();
  std::vector<bool> red = reducedAxesOf(c, rank);
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;
  // Map every output element to the input offsets it covers.
  Dims outDims, redDims, outStr, redStr;
  Dims xs = stridesOf(x.dims);
  for (int64_t d = 0; d < rank; ++d) {
    if (red[size_t(d)]) { redDims.push_back(x.dims[size_t(d)]); redStr.push_back(xs[size_t(d)]); }
    else { outDims.push_back(x.dims[size_t(d)]); outStr.push_back(xs[size_t(d)]); }
  }
  int64_t nOut = product(outDims), nRed = product(redDims);
  SD_CHECK_ARG(nOut == o.numElements(), "reduction output size mismatch");
  const T *px = x.as<T>();
  T *po = o.as<T>();
  if constexpr ((K == RK::Sum || K == RK::Mean) && std::is_floating_point_v<T>) {
    // One contiguous run of reduced axes, x viewed as [outer, nRed, inner]:
    // add whole rows of `inner` into per-column accumulators instead of
    // striding down each column (a bias gradient [rows, N] -> [N]; the
    // backward of GQA's repeated KV heads, [B, Hkv, rep, T, d] -> [B, Hkv, T, d]).
    // Each output still adds its inputs in the order the generic walk does.
    int64_t first = std::find(red.begin(), red.end(), true) - red.begin();
    int64_t last = red.rend() - std::find(red.rbegin(), red.rend(), true); // one past the last reduced axis
    bool run = first < last && std::all_of(red.begin() + first, red.begin() + last, [](bool r) { return r; });
    if (run && nOut > 1 && nRed > 1) {
      int64_t inner = 1;
      for (int64_t d = last; d < rank; ++d) inner *= x.dims[size_t(d)];
      int64_t outer = nOut / inner;
      int64_t chunk = std::max<int64_t>(16, 16384 / nRed); // columns per work item
      int64_t chunksPerRow = (inner + chunk - 1) / chunk;
      parallelFor(c.pool, outer * chunksPerRow, 1, [&](int64_t b, int64_t e) {
        std::vector<double> acc(size_t(std::min(chunk, inner)));
        for (int64_t item = b; item < e; ++item) {
          int64_t o = item / chunksPerRow, j0 = item % chunksPerRow * chunk, j1 = std::min(inner, j0 + chunk);
          std::fill(acc.begin(), acc.end(), 0.0);
          const T *slab = px + o * nRed * inner;
          for (int64_t r = 0; r < nRed; ++r) {
            const T *row = slab + r * inner;
            for (int64_t j = j0; j < j1; ++j) acc[size_t(j - j0)] += double(row[j]);
          }
          for (int64_t j = j0; j < j1; ++j)
            po[o * inner + j] = T(K == RK::Mean ? acc[size_t(j - j0)] / double(nRed) : acc[size_t(j - j0)]);
        }
      });
      return Status::ok();
    }
  }
  // The reduced axes that end x are contiguous: the walk below adds runs of
  // `runLen` neighbours and steps its index only between runs (a per-channel
  // sum over [N, C, H, W]'s axes 0, 2, 3: runs of H x W). Row-major over the
  // reduced axes either way, so the same additions in the same order.
  size_t headDims = redDims.size();
  int64_t runLen = 1;
  for (int64_t d = rank - 1; d >= 0 && red[size_t(d)]; --d) {
    runLen *= x.dims[size_t(d)];
    --headDims;
  }
  const int64_t heads = product(Dims(redDims.begin(), redDims.begin() + int64_t(headDims)));
  parallelFor(c.pool, nOut, std::max<int64_t>(1, 16384 / std::max<int64_t>(nRed, 1)),
              [&](int64_t b, int64_t e) {
    Dims ri(headDims);
    // Calls fn on every input of the output at `base`, in row-major order of the reduced axes.
    auto walk = [&](int64_t base, auto &&fn) {
      std::fill(ri.begin(), ri.end(), 0);
      for (int64_t h = 0; h < heads; ++h) {
        int64_t off = base;
        for (size_t d = 0; d < headDims; ++d) off += ri[d] * redStr[d];
        for (int64_t k = 0; k < runLen; ++k) fn(px[off + k]);
        for (int64_t d = int64_t(headDims) - 1; d >= 0; --d) {
          if (++ri[size_t(d)] < redDims[size_t(d)]) break;
          ri[size_t(d)] = 0;
        }
      }
    };
    for (int64_t i = b; i < e; ++i) {
      int64_t base = 0, rem = i;
      for (int64_t d = int64_t(outDims.size()) - 1; d >= 0; --d) {
        base += (rem % outDims[size_t(d)]) * outStr[size_t(d)];
        rem /= outDims[size_t(d)];
      }
      Acc acc;
      if constexpr (K == RK::Max) acc = Acc(std::numeric_limits<T>::lowest());
      else if constexpr (K == RK::Min) acc = Acc(std::numeric_limits<T>::max());
      else if constexpr (K == RK::Prod) acc = Acc(1);
      else acc = Acc(0);
      // Floats start from -inf/+inf, not the largest finite value: a max over
      // values that are all -inf (a fully masked attention row) is -inf.
      if constexpr ((K == RK::Max || K == RK::Min) && std::is_floating_point_v<T>)
        acc = Acc(K == RK::Max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity());
      Acc mx = Acc(0);
      if constexpr (K == RK::LogSumExp) {
        mx = Acc(-std::numeric_limits<double>::infinity());
        walk(base, [&](T x) { mx = std::max<Acc>(mx, Acc(x)); });
        if (!std::isfinite(double(mx))) mx = Acc(0);
      }
      walk(base, [&](T x) {
        Acc v = Acc(x);
        if constexpr (K == RK::Sum || K == RK::Mean || K == RK::LogSum) acc += v;
        else if constexpr (K == RK::Max) acc = (v > acc || v != v) ? v : acc;
        else if constexpr (K == RK::Min) acc = (v < acc || v != v) ? v : acc;
        else if constexpr (K == RK::Prod) acc *= v;
        else if constexpr (K == RK::L1) acc += v < Acc(0) ? Acc(-v) : v;
        else if constexpr (K == RK::L2 || K == RK::SumSquare) acc += v * v;
        else if constexpr (K == RK::LogSumExp) acc += Acc(std::exp(double(v - mx)));
      });
      if constexpr (K == RK::Mean) acc = nRed ? Acc(acc / Acc(nRed)) : Acc(0);
      else if constexpr (K == RK::L2) acc = Acc(std::sqrt(double(acc)));
      else if constexpr (K == RK::LogSum) acc = Acc(std::log(double(acc)));
      else if constexpr (K == RK::LogSumExp) acc = Acc(std::log(double(acc)) + double(mx));
      po[i] = T(acc);
    }
  });
  return Status::ok();
}

template <RK K> Status reduceKernel(const KernelContext &c) {
  if constexpr (K == RK::Max || K == RK::Min) {
    if (c.inputs[0].dtype == DType::Bool) {
      // Bools reduce as bytes; an empty Min starts from 255 and means true.
      Status s = reduceT<uint8_t, K>(c);
      if (!s.isOk()) return s;
      uint8_t *po = c.outputs[0].as<uint8_t>();
      for (int64_t i = 0, n = c.outputs[0].numElements(); i < n; ++i) po[i] = po[i] != 0;
      return Status::ok();
    }
  }
  return dispatchNumeric(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return reduceT<T, K>(c);
  });
}

template <bool IsMax> Status argKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  if (axis < 0) axis += x.rank();
  bool last = c.attrs.getInt("select_last_index", 0);
  AxisExtent ext = extentAround(x.dims, axis);
  int64_t outer = ext.outer, n = ext.len, inner = ext.inner;
  SD_CHECK_ARG(n > 0, "ArgMax/ArgMin over an empty axis");
  return dispatchNumeric(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>();
    int64_t *po = c.outputs[0].as<int64_t>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const T *p = px + o * n * inner + i;
        int64_t best = 0;
        for (int64_t j = 1; j < n; ++j) {
          T v = p[j * inner], b = p[best * inner];
          bool better = IsMax ? (v > b || (last && v == b)) : (v < b || (last && v == b));
          if (better) best = j;
        }
        po[o * inner + i] = best;
      }
    return Status::ok();
  });
}

} // namespace

void registerReduceKernels() {
  registerCpuKernel("ReduceSum", reduceKernel<RK::Sum>, TypeSet::numeric());
  registerCpuKernel("ReduceMean", reduceKernel<RK::Mean>, TypeSet::numeric());
  registerCpuKernel("ReduceMax", reduceKernel<RK::Max>, TypeSet::numeric() | TypeSet{DType::Bool});
  registerCpuKernel("ReduceMin", reduceKernel<RK::Min>, TypeSet::numeric() | TypeSet{DType::Bool});
  registerCpuKernel("ReduceProd", reduceKernel<RK::Prod>, TypeSet::numeric());
  registerCpuKernel("ReduceL1", reduceKernel<RK::L1>, TypeSet::numeric());
  registerCpuKernel("ReduceL2", reduceKernel<RK::L2>, TypeSet::numeric());
  registerCpuKernel("ReduceLogSum", reduceKernel<RK::LogSum>, TypeSet::floats());
  registerCpuKernel("ReduceLogSumExp", reduceKernel<RK::LogSumExp>, TypeSet::floats());
  registerCpuKernel("ReduceSumSquare", reduceKernel<RK::SumSquare>, TypeSet::numeric());
  registerCpuKernel("ArgMax", argKernel<true>, TypeSet::numeric());
  registerCpuKernel("ArgMin", argKernel<false>, TypeSet::numeric());
}

} // namespace sd::cpu
