// CUDA kernels for the index-driven ops beside Gather (see
// kernels/cpu/indexing.cc): GatherElements, GatherND, ScatterElements,
// ScatterND, TensorScatter, OneHot and TopK.
// The scatters write each output element from one thread, visiting its
// updates in the CPU kernel's order, so repeated indices give the CPU's
// result (the last write, or the reduction in order) with no atomics, and a
// replay equals the eager run bit for bit. A GPU cannot stop mid-step to
// refuse an index out of range, as the CPU does: the gathers read a zero
// there and the scatters skip that update.
#include "cuda_util.cuh"
#include "sd/ops/dispatch.h"
#include "sd/ops/index_geometry.h"
#include <string>

namespace sd::cuda {
namespace {

// The index tensor's dims and the data's strides, passed by value.
struct ElementsGeometry {
  int rank = 0, axis = 0;
  int64_t indDims[kMaxRank] = {}, dataStrides[kMaxRank] = {};
  int64_t axisDim = 0;
};

StatusOr<ElementsGeometry> elementsGeometry(const TensorView &data, const TensorView &ind, int64_t axis,
                                            const char *op) {
  if (axis < 0) axis += data.rank();
  if (axis < 0 || axis >= data.rank()) return sdError(op, ": axis out of range");
  if (ind.rank() != data.rank()) return sdError(op, ": indices and data differ in rank");
  if (data.rank() > kMaxRank) return sdError(op, " on CUDA takes up to rank ", kMaxRank);
  ElementsGeometry g;
  g.rank = int(data.rank());
  g.axis = int(axis);
  g.axisDim = data.dims[size_t(axis)];
  const Dims strides = rowMajorStrides(data.dims);
  for (int d = 0; d < g.rank; ++d) {
    if (d != g.axis && ind.dims[size_t(d)] > data.dims[size_t(d)]) return sdError(op, ": indices exceed data");
    g.indDims[d] = ind.dims[size_t(d)];
    g.dataStrides[d] = strides[size_t(d)];
  }
  return g;
}

// Where element i of the index tensor points in the data (-1: out of range).
template <typename I> __device__ inline int64_t elementOffset(const ElementsGeometry &g, const I *idx, int64_t i) {
  const int64_t v = wrapIndex(idx[i], g.axisDim);
  if (v < 0 || v >= g.axisDim) return -1;
  int64_t off = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    off += (d == g.axis ? v : i % g.indDims[d]) * g.dataStrides[d];
    i /= g.indDims[d];
  }
  return off;
}

template <typename U, typename I>
__global__ void gatherElementsKernel(ElementsGeometry g, const U *x, const I *idx, U *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t off = elementOffset(g, idx, i);
    out[i] = off >= 0 ? x[off] : U(0);
  }
}

Status GatherElementsKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &o = c.outputs[0];
  StatusOr<ElementsGeometry> g = elementsGeometry(x, ind, c.attrs.getInt("axis", 0), "GatherElements");
  if (!g.isOk()) return g.status();
  const int64_t n = o.numElements();
  if (n == 0) return Status::ok();
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    return dispatchIndex(ind.dtype, [&](auto itag) {
      using I = decltype(itag);
      gatherElementsKernel<U, I><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(*g, x.as<U>(), ind.as<I>(), o.as<U>(), n);
      return launchStatus("GatherElements");
    });
  });
}

enum class Reduction { None, Add, Mul, Max, Min };

StatusOr<Reduction> reductionOf(const KernelContext &c, const char *op) {
  const std::string r = c.attrs.getString("reduction", "none");
  if (r == "none") return Reduction::None;
  if (r == "add") return Reduction::Add;
  if (r == "mul") return Reduction::Mul;
  if (r == "max") return Reduction::Max;
  if (r == "min") return Reduction::Min;
  return sdError(op, ": unknown reduction '", r, "'");
}

// The CPU's combine(): std::max/min, so a NaN already there stays.
template <typename T> __device__ inline void combine(T &dst, T update, Reduction r) {
  using C = Compute<T>;
  const C d = load(dst), v = load(update);
  switch (r) {
  case Reduction::None: dst = update; return;
  case Reduction::Add: dst = store<T>(C(d + v)); return;
  case Reduction::Mul: dst = store<T>(C(d * v)); return;
  case Reduction::Max: dst = store<T>(d < v ? v : d); return;
  case Reduction::Min: dst = store<T>(v < d ? v : d); return;
  }
}

// One thread per line of the index tensor along the axis (the other
// coordinates fixed): its updates all land in one line of the output, which
// no other thread writes, visited in index order as the CPU visits them.
template <typename T, typename I>
__global__ void scatterElementsKernel(ElementsGeometry g, const I *idx, const T *upd, T *out, Reduction r,
                                      int64_t lines) {
  const int64_t len = g.indDims[g.axis];
  int64_t inner = 1;
  for (int d = g.axis + 1; d < g.rank; ++d) inner *= g.indDims[d];
  for (int64_t line = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; line < lines;
       line += int64_t(gridDim.x) * blockDim.x) {
    const int64_t first = (line / inner) * len * inner + line % inner;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = first + j * inner, off = elementOffset(g, idx, i);
      if (off >= 0) combine(out[off], upd[i], r);
    }
  }
}

template <typename F> Status dispatchScattered(DType t, F &&f) {
  if (t == DType::I64) return f(int64_t{});
  if (t == DType::I32) return f(int32_t{});
  return dispatchFloatStorage(t, f);
}

Status ScatterElementsKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &upd = c.inputs[2], &o = c.outputs[0];
  StatusOr<ElementsGeometry> g = elementsGeometry(x, ind, c.attrs.getInt("axis", 0), "ScatterElements");
  if (!g.isOk()) return g.status();
  if (ind.dims != upd.dims) return sdError("ScatterElements indices and updates differ in shape");
  StatusOr<Reduction> r = reductionOf(c, "ScatterElements");
  if (!r.isOk()) return r.status();
  SD_RETURN_IF_ERROR(copyTensor(x, o, streamOf(c), "ScatterElements"));
  const int64_t len = g.value().indDims[g.value().axis];
  const int64_t lines = len ? ind.numElements() / len : 0;
  if (lines == 0) return Status::ok();
  return dispatchScattered(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    return dispatchIndex(ind.dtype, [&](auto itag) {
      using I = decltype(itag);
      scatterElementsKernel<T, I><<<blocksFor(lines), kThreads, 0, streamOf(c)>>>(*g, ind.as<I>(), upd.as<T>(),
                                                                                  o.as<T>(), *r, lines);
      return launchStatus("ScatterElements");
    });
  });
}

// ScatterND: each tuple of k indices names a slice of the data (its first k
// axes); slice offsets are multiples of the slice size, so output element
// off + s is written only by tuples at off, through element s. One thread
// per s walks the tuples in order.
template <typename T, typename I>
__global__ void scatterNDKernel(Shape8 data, const I *idx, const T *upd, T *out, int64_t k, int64_t tuples,
                                int64_t slice, Reduction r) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < slice; s += int64_t(gridDim.x) * blockDim.x) {
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t off = 0;
      bool inside = true;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t v = wrapIndex(idx[t * k + j], data.dims[j]);
        inside = inside && v >= 0 && v < data.dims[j];
        off = off * data.dims[j] + v;
      }
      if (inside) combine(out[off * slice + s], upd[t * slice + s], r);
    }
  }
}

Status ScatterNDKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &upd = c.inputs[2], &o = c.outputs[0];
  if (ind.rank() < 1) return sdError("ScatterND indices need a last axis");
  const int64_t k = ind.dims.back();
  if (k > x.rank()) return sdError("ScatterND index depth exceeds data rank");
  if (x.rank() > kMaxRank) return sdError("ScatterND on CUDA takes up to rank ", kMaxRank);
  int64_t slice = 1;
  for (int64_t d = k; d < x.rank(); ++d) slice *= x.dims[size_t(d)];
  const int64_t tuples = k ? ind.numElements() / k : 0;
  if (tuples * slice != upd.numElements()) return sdError("ScatterND updates size mismatch");
  StatusOr<Reduction> r = reductionOf(c, "ScatterND");
  if (!r.isOk()) return r.status();
  SD_RETURN_IF_ERROR(copyTensor(x, o, streamOf(c), "ScatterND"));
  if (tuples == 0 || slice == 0) return Status::ok();
  Shape8 data;
  data.rank = int(x.rank());
  for (int64_t d = 0; d < x.rank(); ++d) data.dims[d] = x.dims[size_t(d)];
  return dispatchScattered(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    return dispatchIndex(ind.dtype, [&](auto itag) {
      using I = decltype(itag);
      scatterNDKernel<T, I><<<blocksFor(slice), kThreads, 0, streamOf(c)>>>(data, ind.as<I>(), upd.as<T>(), o.as<T>(),
                                                                           k, tuples, slice, *r);
      return launchStatus("ScatterND");
    });
  });
}

// GatherND: tuple t of k indices (within batch t / perBatch, for batch_dims
// b) names a slice of the data's axes b + k..; one thread per output element.
struct GatherNDGeometry {
  int b = 0;
  int64_t k = 0, slice = 1, perBatch = 1, batchStride = 0;
  int64_t dims[kMaxRank] = {}, strides[kMaxRank] = {};
};

template <typename U, typename I>
__global__ void gatherNDKernel(GatherNDGeometry g, const U *x, const I *idx, U *out, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / g.slice;
    int64_t off = (t / g.perBatch) * g.batchStride;
    bool inside = true;
    for (int64_t j = 0; j < g.k; ++j) {
      const int64_t dim = g.dims[g.b + j], v = wrapIndex(idx[t * g.k + j], dim);
      inside = inside && v >= 0 && v < dim;
      off += v * g.strides[g.b + j];
    }
    out[e] = inside ? x[off + e % g.slice] : U(0);
  }
}

Status GatherNDKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &o = c.outputs[0];
  if (ind.rank() < 1 || x.rank() > kMaxRank) return sdError("GatherND on CUDA: indices need a last axis, data up to rank 8");
  GatherNDGeometry g;
  g.b = int(c.attrs.getInt("batch_dims", 0));
  g.k = ind.dims.back();
  if (g.b < 0 || g.b + g.k > x.rank()) return sdError("GatherND: batch_dims and index depth exceed the data's rank");
  int64_t batch = 1;
  for (int d = 0; d < g.b; ++d) batch *= x.dims[size_t(d)];
  for (int64_t d = g.b + g.k; d < x.rank(); ++d) g.slice *= x.dims[size_t(d)];
  // (k = 0: each tuple names its batch's whole data, as on the CPU.)
  const int64_t tuples = g.k ? ind.numElements() / g.k : product(Dims(ind.dims.begin(), ind.dims.end() - 1));
  g.perBatch = std::max<int64_t>(tuples / std::max<int64_t>(batch, 1), 1);
  const Dims strides = rowMajorStrides(x.dims);
  g.batchStride = g.b > 0 ? strides[size_t(g.b - 1)] : 0;
  for (int64_t d = 0; d < x.rank(); ++d) g.dims[d] = x.dims[size_t(d)], g.strides[d] = strides[size_t(d)];
  const int64_t n = o.numElements();
  if (tuples * g.slice != n) return sdError("GatherND output size mismatch");
  if (n == 0) return Status::ok();
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    return dispatchIndex(ind.dtype, [&](auto itag) {
      using I = decltype(itag);
      gatherNDKernel<U, I><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(g, x.as<U>(), ind.as<I>(), o.as<U>(), n);
      return launchStatus("GatherND");
    });
  });
}

// OneHot: output element (a, j, i) is `on` where index (a, i) names j (a
// negative one counting from the end), else `off`; an index out of range
// leaves its line all off, as on the CPU.
template <typename U, typename I>
__global__ void oneHotKernel(const I *idx, const U *values, U *out, int64_t depth, int64_t inner, int64_t n) {
  const U off = values[0], on = values[1];
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % inner, j = (e / inner) % depth, a = e / (inner * depth);
    int64_t v = int64_t(idx[a * inner + i]);
    if (v < 0) v += depth;
    out[e] = v == j ? on : off;
  }
}

// TensorScatter (opset 24), a KV-cache write: update's rows along the axis go
// to the cache at write_indices[b] + s (modulo the cache length when
// circular), one thread per element of the update. A linear write past the
// end, which the CPU refuses, is skipped: the cache keeps that row.
struct CacheWrite {
  int64_t len, steps, inner, perBatch; // cache rows, update rows, elements per row, outer slices per batch row
  bool circular;
};

template <typename U, typename I>
__global__ void tensorScatterKernel(CacheWrite g, const U *update, const I *starts, U *cache, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i % g.inner, s = (i / g.inner) % g.steps, p = i / (g.inner * g.steps);
    int64_t at = (starts ? int64_t(starts[p / g.perBatch]) : 0) + s;
    if (g.circular) at = ((at % g.len) + g.len) % g.len;
    if (at >= 0 && at < g.len) cache[(p * g.len + at) * g.inner + e] = update[i];
  }
}

Status TensorScatterKernel(const KernelContext &c) {
  const TensorView &cache = c.inputs[0], &update = c.inputs[1], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", -2);
  if (axis < 0) axis += cache.rank();
  if (axis < 1 || axis >= cache.rank() || update.rank() != cache.rank())
    return sdError("TensorScatter: axis ", c.attrs.getInt("axis", -2), " does not fit a rank-", cache.rank(), " cache");
  const AxisExtent ce = extentAround(cache.dims, axis), ue = extentAround(update.dims, axis);
  if (ce.outer != ue.outer || ce.inner != ue.inner) return sdError("TensorScatter update does not fit the cache");
  const bool hasStarts = c.hasInput(2) && c.inputs[2].data;
  if (hasStarts && c.inputs[2].numElements() != cache.dims[0])
    return sdError("TensorScatter write_indices must hold one integer per batch row");
  SD_RETURN_IF_ERROR(copyTensor(cache, o, streamOf(c), "TensorScatter"));
  const int64_t n = update.numElements();
  if (n == 0 || ce.len == 0) return Status::ok();
  const CacheWrite g{ce.len, ue.len, ce.inner, ce.outer / cache.dims[0],
                     c.attrs.getString("mode", "linear") == "circular"};
  auto launch = [&](auto itag) {
    using I = decltype(itag);
    return dispatchByWidth(o.dtype, [&](auto tag) {
      using U = decltype(tag);
      tensorScatterKernel<U, I><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(
          g, update.as<U>(), hasStarts ? c.inputs[2].as<I>() : nullptr, o.as<U>(), n);
      return launchStatus("TensorScatter");
    });
  };
  return hasStarts ? dispatchIndex(c.inputs[2].dtype, launch) : launch(int64_t{});
}

Status OneHotKernel(const KernelContext &c) {
  const TensorView &ind = c.inputs[0], &vals = c.inputs[2], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", -1);
  if (axis < 0) axis += o.rank();
  if (axis < 0 || axis >= o.rank()) return sdError("OneHot: axis out of range");
  if (vals.numElements() != 2 || vals.dtype != o.dtype) return sdError("OneHot values must be 2 of the output's type");
  const AxisExtent ext = extentAround(o.dims, axis);
  const int64_t n = o.numElements();
  if (n == 0) return Status::ok();
  auto launch = [&](auto itag) {
    using I = decltype(itag);
    return dispatchByWidth(o.dtype, [&](auto tag) {
      using U = decltype(tag);
      oneHotKernel<U, I><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(ind.as<I>(), vals.as<U>(), o.as<U>(), ext.len,
                                                                     ext.inner, n);
      return launchStatus("OneHot");
    });
  };
  if (ind.dtype == DType::F32) return launch(float{}); // (indices of any numeric type, truncated)
  if (ind.dtype == DType::F64) return launch(double{});
  return dispatchIndex(ind.dtype, launch);
}

// TopK: one thread per line along the axis picks its k best one by one,
// each the best value after the last one picked in the order (value, then
// lower index first): the CPU's stable sort's first k, ties included, with
// no scratch memory. O(k n) a line: meant for routers' and heads' small k.
// kFromDevice (TopKBounded): k is a device scalar; places past it get zeros.
template <typename T>
__global__ void topKKernel(const T *x, T *values, int64_t *indices, int64_t outer, int64_t n, int64_t inner,
                           int64_t width, int64_t fixedK, const int64_t *deviceK, bool largest) {
  using C = Compute<T>;
  const int64_t k = deviceK ? *deviceK : fixedK;
  for (int64_t line = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; line < outer * inner;
       line += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = line / inner, i = line % inner;
    const T *p = x + a * n * inner + i;
    C lastV = C(0);
    int64_t last = -1;
    for (int64_t j = 0; j < width; ++j) {
      int64_t best = -1;
      C bestV = C(0);
      if (j < k) {
        for (int64_t q = 0; q < n; ++q) {
          const C v = load(p[q * inner]);
          // After the last pick: a worse value, or an equal one at a higher index.
          const bool after = last < 0 || (largest ? v < lastV : v > lastV) || (v == lastV && q > last);
          if (after && (best < 0 || (largest ? v > bestV : v < bestV))) best = q, bestV = v;
        }
      }
      const int64_t out = (a * width + j) * inner + i;
      values[out] = best >= 0 ? p[best * inner] : store<T>(C(0));
      if (indices) indices[out] = best >= 0 ? best : 0;
      if (best >= 0) last = best, lastV = bestV;
    }
  }
}

Status topK(const KernelContext &c, int64_t fixedK, const int64_t *deviceK, const char *op) {
  const TensorView &x = c.inputs[0], &vals = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", -1);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank() || vals.rank() != x.rank()) return sdError(op, ": axis out of range");
  const int64_t n = x.dims[size_t(axis)], width = vals.dims[size_t(axis)];
  if (!deviceK && (fixedK < 0 || fixedK > n)) return sdError(op, " k=", fixedK, " is outside [0, ", n, "]");
  if (width > n) return sdError(op, ": result wider than the axis");
  const AxisExtent ext = extentAround(x.dims, axis);
  const int64_t lines = ext.outer * ext.inner;
  if (lines == 0 || width == 0) return Status::ok();
  int64_t *indices = c.outputs.size() > 1 && c.outputs[1].data ? c.outputs[1].as<int64_t>() : nullptr;
  const bool largest = c.attrs.getInt("largest", 1) != 0;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    topKKernel<T><<<blocksFor(lines), kThreads, 0, streamOf(c)>>>(x.as<T>(), vals.as<T>(), indices, ext.outer, n,
                                                                  ext.inner, width, fixedK, deviceK, largest);
    return launchStatus(op);
  };
  if (x.dtype == DType::I64) return launch(int64_t{});
  if (x.dtype == DType::I32) return launch(int32_t{});
  return dispatchFloatStorage(x.dtype, launch);
}

Status TopKKernel(const KernelContext &c) {
  const TensorView &v = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", -1);
  if (axis < 0) axis += v.rank();
  if (axis < 0 || axis >= v.rank()) return sdError("TopK: axis out of range");
  return topK(c, v.dims[size_t(axis)], nullptr, "TopK");
}

// TopKBounded: k a run-time i64 scalar at most the result's width (read on the
// device; a k past the axis gives the whole axis); outputs[2] repeats it.
Status TopKBoundedKernel(const KernelContext &c) {
  const TensorView &k = c.inputs[1];
  if (k.dtype != DType::I64 || k.numElements() != 1) return sdError("TopK k must be one i64 integer");
  SD_RETURN_IF_ERROR(topK(c, 0, k.as<int64_t>(), "TopK"));
  if (c.outputs.size() < 3 || !c.outputs[2].data || c.outputs[2].data == k.data) return Status::ok();
  return cudaCheck(cudaMemcpyAsync(c.outputs[2].data, k.data, sizeof(int64_t), cudaMemcpyDeviceToDevice, streamOf(c)),
                   "TopK");
}

} // namespace

void registerIndexingKernels() {
  const TypeSet ranked = floatStorage() | TypeSet{DType::I64, DType::I32};
  registerKernel("TopK", TopKKernel, ranked);
  registerKernel("TopKBounded", TopKBoundedKernel, ranked);
  registerKernel("OneHot", OneHotKernel, TypeSet::all(), nullptr, -1);
  registerKernel("GatherElements", GatherElementsKernel, TypeSet::all());
  registerKernel("GatherND", GatherNDKernel, TypeSet::all());
  const TypeSet scattered = floatStorage() | TypeSet{DType::I64, DType::I32};
  registerKernel("ScatterElements", ScatterElementsKernel, scattered);
  registerKernel("ScatterND", ScatterNDKernel, scattered);
  registerKernel("TensorScatter", TensorScatterKernel, TypeSet::all());
}

} // namespace sd::cuda
