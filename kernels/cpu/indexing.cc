// CPU kernels for index-driven ops: Gather, GatherElements, GatherND,
// ScatterElements, ScatterND, TensorScatter, OneHot, TopK. Every index is
// bounds-checked.
#include "cpu_util.h"
#include <atomic>
#include <algorithm>
#include <numeric>

namespace sd::cpu {
namespace {

// Reads index tensor values, normalizing negatives against `dim` and checking range.
Status loadIndices(const TensorView &t, int64_t dim, std::vector<int64_t> &out, const char *op) {
  if (!readIntegers(t, out)) return sdError(op, " indices must be integers");
  for (int64_t &v : out) {
    int64_t orig = v;
    if (v < 0) v += dim;
    if (v < 0 || v >= dim) return sdError(op, " index ", orig, " out of range [", -dim, ", ", dim, ")");
  }
  return Status::ok();
}

// Gather of single 4-byte elements from a 1-D table by int32 indices (a
// lookup table such as NF4's, per weight value): read in place, each checked,
// without widening every index to int64 first.
Status gatherElements32(const KernelContext &c, int64_t dim) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &o = c.outputs[0];
  const int64_t n = ind.numElements();
  SD_CHECK_ARG(n == o.numElements(), "Gather output size mismatch");
  const uint32_t *table = x.as<uint32_t>();
  const int32_t *idx = ind.as<int32_t>();
  uint32_t *out = o.as<uint32_t>();
  std::atomic<int64_t> bad{-1};
  parallelFor(c.pool, n, 16384, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t v = idx[i] < 0 ? int64_t(idx[i]) + dim : int64_t(idx[i]);
      if (v < 0 || v >= dim) {
        bad.store(i);
        return;
      }
      out[i] = table[v];
    }
  });
  if (int64_t i = bad.load(); i >= 0)
    return sdError("Gather index ", idx[i], " out of range [", -dim, ", ", dim, ")");
  return Status::ok();
}

Status GatherKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  if (axis < 0) axis += x.rank();
  AxisExtent ext = extentAround(x.dims, axis);
  int64_t outer = ext.outer, dim = ext.len, inner = ext.inner;
  if (outer == 1 && inner == 1 && dtypeSize(x.dtype) == 4 && c.inputs[1].dtype == DType::I32)
    return gatherElements32(c, dim);
  std::vector<int64_t> idx;
  SD_RETURN_IF_ERROR(loadIndices(c.inputs[1], dim, idx, "Gather"));
  int64_t ni = int64_t(idx.size());
  SD_CHECK_ARG(outer * ni * inner == o.numElements(), "Gather output size mismatch");
  size_t row = size_t(inner) * dtypeSize(x.dtype);
  const char *px = x.as<char>();
  char *po = o.as<char>();
  parallelFor(c.pool, outer * ni, std::max<int64_t>(1, 65536 / int64_t(row + 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t oi = r / ni, j = r % ni;
      std::memcpy(po + size_t(r) * row, px + size_t(oi * dim + idx[size_t(j)]) * row, row);
    }
  });
  return Status::ok();
}

// Scatter-add of Gather's output gradient into a zeroed data gradient. Each
// worker owns a range of columns and walks every index in order, so repeated
// indices sum in the same order on every run (no atomics, bit-reproducible).
Status GatherGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  if (axis < 0) axis += o.rank();
  AxisExtent ext = extentAround(o.dims, axis);
  std::vector<int64_t> idx;
  SD_RETURN_IF_ERROR(loadIndices(c.inputs[1], ext.len, idx, "GatherGrad"));
  int64_t ni = int64_t(idx.size()), inner = ext.inner;
  SD_CHECK_ARG(ext.outer * ni * inner == dy.numElements(), "GatherGrad gradient size mismatch");
  return dispatchFloat(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *pdy = dy.as<T>();
    T *po = o.as<T>();
    std::memset(po, 0, o.byteSize());
    parallelFor(c.pool, inner, 64, [&](int64_t c0, int64_t c1) {
      for (int64_t oi = 0; oi < ext.outer; ++oi)
        for (int64_t j = 0; j < ni; ++j) {
          const T *src = pdy + (oi * ni + j) * inner;
          T *dst = po + (oi * ext.len + idx[size_t(j)]) * inner;
          for (int64_t k = c0; k < c1; ++k) dst[k] += src[k];
        }
    });
    return Status::ok();
  });
}

Status GatherElementsKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  if (axis < 0) axis += x.rank();
  std::vector<int64_t> idx;
  SD_RETURN_IF_ERROR(loadIndices(ind, x.dims[size_t(axis)], idx, "GatherElements"));
  Dims xs = stridesOf(x.dims);
  for (int64_t d = 0; d < x.rank(); ++d)
    SD_CHECK_ARG(d == axis || ind.dims[size_t(d)] <= x.dims[size_t(d)], "GatherElements indices exceed data");
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    Dims pos(size_t(ind.rank()), 0);
    for (size_t i = 0; i < idx.size(); ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < pos.size(); ++d) off += (int64_t(d) == axis ? idx[i] : pos[d]) * xs[d];
      o.as<T>()[i] = x.as<T>()[off];
      for (int64_t d = ind.rank() - 1; d >= 0; --d) {
        if (++pos[size_t(d)] < ind.dims[size_t(d)]) break;
        pos[size_t(d)] = 0;
      }
    }
    return Status::ok();
  });
}

Status GatherNDKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &o = c.outputs[0];
  int64_t b = c.attrs.getInt("batch_dims", 0), k = ind.dims.back();
  std::vector<int64_t> idx;
  SD_CHECK_ARG(readIntegers(ind, idx), "GatherND indices must be integers");
  int64_t batch = 1;
  for (int64_t d = 0; d < b; ++d) batch *= x.dims[size_t(d)];
  int64_t slice = 1;
  for (int64_t d = b + k; d < x.rank(); ++d) slice *= x.dims[size_t(d)];
  int64_t tuples = int64_t(idx.size()) / std::max<int64_t>(k, 1);
  if (k == 0) tuples = ind.numElements() == 0 ? product(Dims(ind.dims.begin(), ind.dims.end() - 1)) : 0;
  int64_t perBatch = tuples / std::max<int64_t>(batch, 1);
  Dims xs = stridesOf(x.dims);
  int64_t batchStride = b > 0 ? xs[size_t(b - 1)] : 0;
  size_t es = dtypeSize(x.dtype);
  SD_CHECK_ARG(tuples * slice == o.numElements(), "GatherND output size mismatch");
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t off = (t / std::max<int64_t>(perBatch, 1)) * batchStride;
    for (int64_t j = 0; j < k; ++j) {
      int64_t dim = x.dims[size_t(b + j)], v = idx[size_t(t * k + j)];
      if (v < 0) v += dim;
      SD_CHECK_ARG(v >= 0 && v < dim, "GatherND index out of range");
      off += v * xs[size_t(b + j)];
    }
    std::memcpy(o.as<char>() + size_t(t * slice) * es, x.as<char>() + size_t(off) * es, size_t(slice) * es);
  }
  return Status::ok();
}

template <typename T> void combine(T &dst, T v, const std::string &red) {
  if (red == "add") dst = T(dst + v);
  else if (red == "mul") dst = T(dst * v);
  else if (red == "max") dst = std::max(dst, v);
  else if (red == "min") dst = std::min(dst, v);
  else dst = v;
}

// TensorScatter (opset 24): a KV-cache write. update's rows along `axis` go to
// the cache at write_indices[b] + s (modulo the cache length when circular);
// a linear write past the end is an error, never an overrun.
Status TensorScatterKernel(const KernelContext &c) {
  const TensorView &cache = c.inputs[0], &update = c.inputs[1], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", -2);
  if (axis < 0) axis += cache.rank();
  bool circular = c.attrs.getString("mode", "linear") == "circular";
  AxisExtent ce = extentAround(cache.dims, axis), ue = extentAround(update.dims, axis);
  int64_t batch = cache.dims[0], perBatch = ce.outer / std::max<int64_t>(batch, 1);
  std::vector<int64_t> starts(size_t(batch), 0);
  if (c.hasInput(2) && c.inputs[2].data)
    SD_CHECK_ARG(readIntegers(c.inputs[2], starts) && int64_t(starts.size()) == batch,
                 "TensorScatter write_indices must hold one integer per batch row");
  size_t row = size_t(ce.inner) * dtypeSize(cache.dtype);
  std::memcpy(o.data, cache.data, size_t(cache.numElements()) * dtypeSize(cache.dtype));
  char *po = o.as<char>();
  const char *pu = update.as<char>();
  for (int64_t p = 0; p < ce.outer; ++p) {
    int64_t b = p / perBatch;
    for (int64_t s = 0; s < ue.len; ++s) {
      int64_t at = starts[size_t(b)] + s;
      if (circular) at = ((at % ce.len) + ce.len) % ce.len;
      SD_CHECK_ARG(at >= 0 && at < ce.len, "TensorScatter writes position ", at, " of a cache of ", ce.len,
                   " (write_indices[", b, "] = ", starts[size_t(b)], ")");
      std::memcpy(po + size_t(p * ce.len + at) * row, pu + size_t(p * ue.len + s) * row, row);
    }
  }
  return Status::ok();
}

Status ScatterElementsKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &upd = c.inputs[2], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  if (axis < 0) axis += x.rank();
  std::string red = c.attrs.getString("reduction", "none");
  std::vector<int64_t> idx;
  SD_RETURN_IF_ERROR(loadIndices(ind, x.dims[size_t(axis)], idx, "ScatterElements"));
  SD_CHECK_ARG(ind.dims == upd.dims, "ScatterElements indices and updates differ in shape");
  for (int64_t d = 0; d < x.rank(); ++d)
    SD_CHECK_ARG(d == axis || ind.dims[size_t(d)] <= x.dims[size_t(d)], "ScatterElements indices exceed data");
  std::memcpy(o.data, x.data, x.byteSize());
  Dims xs = stridesOf(x.dims);
  return dispatchNumeric(x.dtype == DType::Bool ? DType::U8 : x.dtype, [&](auto tag) {
    using T = decltype(tag);
    Dims pos(size_t(ind.rank()), 0);
    for (size_t i = 0; i < idx.size(); ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < pos.size(); ++d) off += (int64_t(d) == axis ? idx[i] : pos[d]) * xs[d];
      combine(o.as<T>()[off], upd.as<T>()[i], red);
      for (int64_t d = ind.rank() - 1; d >= 0; --d) {
        if (++pos[size_t(d)] < ind.dims[size_t(d)]) break;
        pos[size_t(d)] = 0;
      }
    }
    return Status::ok();
  });
}

Status ScatterNDKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &upd = c.inputs[2], &o = c.outputs[0];
  std::string red = c.attrs.getString("reduction", "none");
  int64_t k = ind.dims.back();
  SD_CHECK_ARG(k <= x.rank(), "ScatterND index depth exceeds data rank");
  std::vector<int64_t> idx;
  SD_CHECK_ARG(readIntegers(ind, idx), "ScatterND indices must be integers");
  int64_t slice = 1;
  for (int64_t d = k; d < x.rank(); ++d) slice *= x.dims[size_t(d)];
  int64_t tuples = k ? int64_t(idx.size()) / k : 0;
  SD_CHECK_ARG(tuples * slice == upd.numElements(), "ScatterND updates size mismatch");
  std::memcpy(o.data, x.data, x.byteSize());
  Dims xs = stridesOf(x.dims);
  return dispatchNumeric(x.dtype == DType::Bool ? DType::U8 : x.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t off = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t dim = x.dims[size_t(j)], v = idx[size_t(t * k + j)];
        if (v < 0) v += dim;
        if (v < 0 || v >= dim) return sdError("ScatterND index ", v, " out of range");
        off += v * xs[size_t(j)];
      }
      for (int64_t s = 0; s < slice; ++s) combine(o.as<T>()[off + s], upd.as<T>()[t * slice + s], red);
    }
    return Status::ok();
  });
}

Status OneHotKernel(const KernelContext &c) {
  const TensorView &ind = c.inputs[0], &vals = c.inputs[2], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", -1);
  if (axis < 0) axis += o.rank();
  AxisExtent ext = extentAround(o.dims, axis);
  int64_t outer = ext.outer, depth = ext.len, inner = ext.inner;
  std::vector<double> idx;
  SD_CHECK_ARG(readDoubles(ind, idx), "OneHot indices must be numeric");
  SD_CHECK_ARG(vals.numElements() == 2, "OneHot values must have 2 elements");
  return dispatchBytes(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    T off = vals.as<T>()[0], on = vals.as<T>()[1];
    T *po = o.as<T>();
    std::fill(po, po + o.numElements(), off);
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t i = 0; i < inner; ++i) {
        int64_t v = int64_t(idx[size_t(a * inner + i)]);
        if (v < 0) v += depth;
        if (v >= 0 && v < depth) po[(a * depth + v) * inner + i] = on; // out of range: all off
      }
    return Status::ok();
  });
}

// The k best along the axis into values/indices `width` wide along it (k
// for TopK; the whole axis for TopKBounded, zeros after the first k).
Status topK(const KernelContext &c, int64_t k) {
  const TensorView &x = c.inputs[0], &vals = c.outputs[0];
  int64_t *inds = c.outputs.size() > 1 ? c.outputs[1].as<int64_t>() : nullptr;
  int64_t axis = c.attrs.getInt("axis", -1);
  if (axis < 0) axis += x.rank();
  bool largest = c.attrs.getInt("largest", 1);
  int64_t n = x.dims[size_t(axis)], width = vals.dims[size_t(axis)];
  SD_CHECK_ARG(k >= 0 && k <= n, "TopK k=", k, " is outside [0, ", n, "], the axis size");
  SD_CHECK_ARG(k <= width, "TopK k=", k, " exceeds its result's bound ", width);
  AxisExtent ext = extentAround(x.dims, axis);
  int64_t outer = ext.outer, inner = ext.inner;
  return dispatchNumeric(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>();
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t i = 0; i < inner; ++i) {
        auto at = [&](int64_t j) { return px[(a * n + j) * inner + i]; };
        std::iota(order.begin(), order.end(), 0);
        // Ties keep the lower index first, as ONNX requires.
        std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
          return largest ? at(p) > at(q) : at(p) < at(q);
        });
        for (int64_t j = 0; j < width; ++j) {
          vals.as<T>()[(a * width + j) * inner + i] = j < k ? at(order[size_t(j)]) : T(0);
          if (inds) inds[(a * width + j) * inner + i] = j < k ? order[size_t(j)] : 0;
        }
      }
    return Status::ok();
  });
}

Status TopKKernel(const KernelContext &c) {
  int64_t axis = c.attrs.getInt("axis", -1);
  return topK(c, c.outputs[0].dims[size_t(axis < 0 ? axis + c.outputs[0].rank() : axis)]);
}

Status TopKBoundedKernel(const KernelContext &c) {
  std::vector<int64_t> k;
  SD_CHECK_ARG(readIntegers(c.inputs[1], k) && k.size() == 1, "TopK k must be one integer");
  SD_RETURN_IF_ERROR(topK(c, k[0]));
  *c.outputs[2].as<int64_t>() = k[0];
  return Status::ok();
}

} // namespace

void registerIndexingKernels() {
  registerCpuKernel("Gather", GatherKernel, TypeSet::all());
  registerCpuKernel("GatherGrad", GatherGradKernel, TypeSet::floats());
  registerCpuKernel("GatherElements", GatherElementsKernel, TypeSet::all());
  registerCpuKernel("GatherND", GatherNDKernel, TypeSet::all());
  registerCpuKernel("ScatterElements", ScatterElementsKernel, TypeSet::numeric() | TypeSet{DType::Bool});
  registerCpuKernel("ScatterND", ScatterNDKernel, TypeSet::numeric() | TypeSet{DType::Bool});
  registerCpuKernel("TensorScatter", TensorScatterKernel, TypeSet::all());
  registerCpuKernel("OneHot", OneHotKernel, TypeSet::all(), nullptr, -1);
  registerCpuKernel("TopK", TopKKernel, TypeSet::numeric());
  registerCpuKernel("TopKBounded", TopKBoundedKernel, TypeSet::numeric());
}

} // namespace sd::cpu
