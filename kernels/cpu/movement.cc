// CPU kernels for layout and data movement: Transpose, Concat, Split, Slice,
// Expand, Tile, Pad, CenterCropPad, ReverseSequence, DepthToSpace/SpaceToDepth,
// and the pure copies
// (Reshape, Squeeze, Unsqueeze, Flatten) used when they are not aliases.
#include "cpu_util.h"
#include "sd/ops/index_geometry.h"
#include <algorithm>

namespace sd::cpu {
namespace {

Status copyAll(const KernelContext &c) {
  SD_CHECK_ARG(c.inputs[0].byteSize() == c.outputs[0].byteSize(), "copy size mismatch");
  if (c.outputs[0].data != c.inputs[0].data)
    std::memcpy(c.outputs[0].data, c.inputs[0].data, c.inputs[0].byteSize());
  return Status::ok();
}

// Generic strided gather: out[i] = in[sum_d idx_d * srcStride_d], row-major over outDims.
template <typename T>
void stridedCopy(ThreadPool *pool, const T *src, T *dst, const Dims &outDims, const Dims &srcStrides,
                 int64_t srcBase = 0) {
  Dims st[1] = {srcStrides};
  forEachBroadcastRow<1>(pool, outDims, st, [&](int64_t oo, const int64_t *in, int64_t n, const int64_t *s) {
    const T *p = src + srcBase + in[0];
    T *q = dst + oo;
    if (s[0] == 1) std::copy(p, p + n, q);
    else for (int64_t i = 0; i < n; ++i) q[i] = p[i * s[0]];
  });
}

Status TransposeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  std::vector<int64_t> perm = c.attrs.getInts("perm");
  if (perm.empty())
    for (int64_t i = x.rank() - 1; i >= 0; --i) perm.push_back(i);
  SD_CHECK_ARG(int64_t(perm.size()) == x.rank(), "Transpose perm length mismatch");
  Dims xs = stridesOf(x.dims), st(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    SD_CHECK_ARG(perm[i] >= 0 && perm[i] < x.rank(), "Transpose perm out of range");
    st[i] = xs[size_t(perm[i])];
  }
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    stridedCopy<T>(c.pool, x.as<T>(), c.outputs[0].as<T>(), c.outputs[0].dims, st);
    return Status::ok();
  });
}

// Concat and Split move the same rows: `whole` is cut along `axis` into
// `parts` (Split) or assembled from them (Concat).
Status copyAlongAxis(const TensorView &whole, const std::vector<TensorView> &parts, int64_t axis, bool assemble) {
  if (axis < 0) axis += whole.rank();
  AxisExtent e = extentAround(whole.dims, axis);
  int64_t es = int64_t(dtypeSize(whole.dtype)), wholeRow = e.len * e.inner * es, off = 0;
  for (const TensorView &p : parts) {
    int64_t row = p.dims[size_t(axis)] * e.inner * es;
    SD_CHECK_ARG(off + row <= wholeRow, assemble ? "Concat inputs exceed output" : "Split outputs exceed input");
    for (int64_t i = 0; i < e.outer; ++i) {
      char *w = whole.as<char>() + i * wholeRow + off, *q = p.as<char>() + i * row;
      if (assemble) std::memcpy(w, q, size_t(row));
      else std::memcpy(q, w, size_t(row));
    }
    off += row;
  }
  return Status::ok();
}

Status ConcatKernel(const KernelContext &c) {
  return copyAlongAxis(c.outputs[0], c.inputs, c.attrs.getInt("axis", 0), true);
}

Status SplitKernel(const KernelContext &c) {
  return copyAlongAxis(c.inputs[0], c.outputs, c.attrs.getInt("axis", 0), false);
}

Status SliceKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  std::vector<int64_t> starts, ends, axes, steps;
  readIntegers(c.inputs[1], starts);
  readIntegers(c.inputs[2], ends);
  if (c.hasInput(3) && c.inputs[3].data) readIntegers(c.inputs[3], axes);
  if (c.hasInput(4) && c.inputs[4].data) readIntegers(c.inputs[4], steps);
  SliceView view;
  SD_RETURN_IF_ERROR(sliceView(x.dims, starts, ends, axes, steps, o.dims, view));
  const Dims &st = view.strides;
  int64_t base = view.base;
  if (o.numElements() == 0) return Status::ok();
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    stridedCopy<T>(c.pool, x.as<T>(), o.as<T>(), o.dims, st, base);
    return Status::ok();
  });
}

Status ExpandKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  SD_CHECK_ARG(x.rank() <= o.rank(), "Expand output rank too small");
  for (int64_t i = 0; i < x.rank(); ++i) {
    int64_t xd = x.dims[size_t(i)], od = o.dims[size_t(o.rank() - x.rank() + i)];
    SD_CHECK_ARG(xd == od || xd == 1, "Expand cannot broadcast ", formatDims(x.dims), " to ",
                 formatDims(o.dims));
  }
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    stridedCopy<T>(c.pool, x.as<T>(), o.as<T>(), o.dims, broadcastStrides(x.dims, o.dims));
    return Status::ok();
  });
}

Status TileKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  StatusOr<StridedRead> read = tileRead(x.dims, o.dims);
  if (!read.isOk()) return read.status();
  if (o.numElements() == 0) return Status::ok();
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    stridedCopy<T>(c.pool, x.as<T>(), o.as<T>(), read.value().dims, read.value().strides);
    return Status::ok();
  });
}

// CenterCropPad: each listed axis cropped or zero-padded about its center
// (the extra element, when the change is odd, at the end), as onnx/reference.
Status CenterCropPadKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  size_t rank = x.dims.size();
  Dims shift(rank); // source index = output index + shift
  for (size_t d = 0; d < rank; ++d)
    shift[d] = x.dims[d] >= o.dims[d] ? (x.dims[d] - o.dims[d]) / 2 : -((o.dims[d] - x.dims[d]) / 2);
  Dims inStr = stridesOf(x.dims);
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>();
    T *po = o.as<T>();
    Dims idx(rank, 0);
    for (int64_t i = 0, n = o.numElements(); i < n; ++i) {
      int64_t off = 0;
      bool inside = true;
      for (size_t d = 0; d < rank && inside; ++d) {
        int64_t s = idx[d] + shift[d];
        inside = s >= 0 && s < x.dims[d];
        off += s * inStr[d];
      }
      po[i] = inside ? px[off] : T{};
      for (int64_t d = int64_t(rank) - 1; d >= 0; --d) {
        if (++idx[size_t(d)] < o.dims[size_t(d)]) break;
        idx[size_t(d)] = 0;
      }
    }
    return Status::ok();
  });
}

// ReverseSequence: per batch entry b, the first sequence_lens[b] steps along
// time_axis reversed, the rest copied.
Status ReverseSequenceKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  int64_t batchAxis = c.attrs.getInt("batch_axis", 1), timeAxis = c.attrs.getInt("time_axis", 0);
  std::vector<int64_t> lens;
  SD_CHECK_ARG(readIntegers(c.inputs[1], lens) && int64_t(lens.size()) == x.dims[size_t(batchAxis)],
               "ReverseSequence sequence_lens must hold one integer per batch entry");
  int64_t steps = x.dims[size_t(timeAxis)];
  for (int64_t len : lens)
    SD_CHECK_ARG(len >= 0 && len <= steps, "ReverseSequence length ", len, " is outside [0, ", steps, "]");
  Dims str = stridesOf(x.dims);
  size_t width = dtypeSize(x.dtype);
  const char *px = x.as<char>();
  char *po = o.as<char>();
  Dims idx(x.dims.size(), 0);
  for (int64_t i = 0, n = x.numElements(); i < n; ++i) {
    int64_t t = idx[size_t(timeAxis)], len = lens[size_t(idx[size_t(batchAxis)])];
    int64_t src = i + (t < len ? (len - 1 - 2 * t) * str[size_t(timeAxis)] : 0);
    std::memcpy(po + size_t(i) * width, px + size_t(src) * width, width);
    for (int64_t d = int64_t(idx.size()) - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < x.dims[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  return Status::ok();
}

Status PadKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  std::string mode = c.attrs.getString("mode", "constant");
  std::vector<int64_t> pads, axes;
  readIntegers(c.inputs[1], pads);
  if (c.hasInput(3) && c.inputs[3].data) readIntegers(c.inputs[3], axes);
  Dims before;
  SD_RETURN_IF_ERROR(padBefore(x.dims, pads, axes, o.dims, before));
  if (mode != "constant")
    for (int64_t d = 0; d < x.rank(); ++d)
      SD_CHECK_ARG(x.dims[size_t(d)] > 0 || o.dims[size_t(d)] == 0, "Pad ", mode, " of an empty axis");
  Dims xs = stridesOf(x.dims);
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    T fill{};
    if (c.hasInput(2) && c.inputs[2].data && c.inputs[2].numElements() > 0)
      std::memcpy(&fill, c.inputs[2].data, sizeof(T));
    const T *px = x.as<T>();
    T *po = o.as<T>();
    // Constant padding that only grows (the backward of a Slice, the label
    // shift): fill, then copy each input row into place.
    bool grows = mode == "constant" && x.rank() > 0;
    for (size_t d = 0; grows && d < before.size(); ++d)
      grows = before[d] >= 0 && o.dims[d] >= x.dims[d] + before[d];
    if (grows) {
      std::fill(po, po + o.numElements(), fill);
      int64_t rowLen = x.dims.back(), rows = rowLen ? x.numElements() / rowLen : 0;
      Dims os = stridesOf(o.dims), row(size_t(x.rank() - 1), 0);
      for (int64_t r = 0; r < rows; ++r) {
        int64_t off = before.back();
        for (size_t d = 0; d < row.size(); ++d) off += (row[d] + before[d]) * os[d];
        std::memcpy(po + off, px + r * rowLen, size_t(rowLen) * sizeof(T));
        for (int64_t d = int64_t(row.size()) - 1; d >= 0; --d) {
          if (++row[size_t(d)] < x.dims[size_t(d)]) break;
          row[size_t(d)] = 0;
        }
      }
      return Status::ok();
    }
    Dims idx(size_t(o.rank()), 0);
    for (int64_t i = 0, n = o.numElements(); i < n; ++i) {
      int64_t off = 0;
      bool outside = false;
      for (size_t d = 0; d < idx.size(); ++d) {
        int64_t j = idx[d] - before[d], dim = x.dims[d];
        if (j < 0 || j >= dim) {
          if (mode == "constant") { outside = true; break; }
          if (mode == "edge") j = j < 0 ? 0 : dim - 1;
          else if (mode == "wrap") j = ((j % dim) + dim) % dim;
          else { // reflect
            if (dim == 1) j = 0;
            else {
              int64_t period = 2 * (dim - 1);
              j = ((j % period) + period) % period;
              if (j >= dim) j = period - j;
            }
          }
        }
        off += j * xs[d];
      }
      po[i] = outside ? fill : px[off];
      for (int64_t d = o.rank() - 1; d >= 0; --d) {
        if (++idx[size_t(d)] < o.dims[size_t(d)]) break;
        idx[size_t(d)] = 0;
      }
    }
    return Status::ok();
  });
}

// DepthToSpace/SpaceToDepth as a 6-D transpose.
Status blockRearrange(const KernelContext &c, bool toSpace) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  StatusOr<StridedRead> read = blockRearrangeRead(x.dims, c.attrs.getInt("blocksize", 1),
                                                  c.attrs.getString("mode", "DCR") == "CRD", toSpace);
  if (!read.isOk()) return read.status();
  SD_CHECK_ARG(o.numElements() == x.numElements(), "block rearrangement size mismatch");
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    stridedCopy<T>(c.pool, x.as<T>(), o.as<T>(), read.value().dims, read.value().strides);
    return Status::ok();
  });
}
Status DepthToSpaceKernel(const KernelContext &c) { return blockRearrange(c, true); }
Status SpaceToDepthKernel(const KernelContext &c) { return blockRearrange(c, false); }

} // namespace

void registerMovementKernels() {
  for (const char *op : {"Reshape", "Squeeze", "Unsqueeze", "Flatten"}) registerCpuKernel(op, copyAll, TypeSet::all());
  registerCpuKernel("Transpose", TransposeKernel, TypeSet::all());
  registerCpuKernel("Concat", ConcatKernel, TypeSet::all());
  registerCpuKernel("Split", SplitKernel, TypeSet::all());
  registerCpuKernel("Slice", SliceKernel, TypeSet::all());
  registerCpuKernel("Expand", ExpandKernel, TypeSet::all());
  registerCpuKernel("Tile", TileKernel, TypeSet::all());
  registerCpuKernel("Pad", PadKernel, TypeSet::all());
  registerCpuKernel("CenterCropPad", CenterCropPadKernel, TypeSet::all());
  registerCpuKernel("ReverseSequence", ReverseSequenceKernel, TypeSet::all());
  registerCpuKernel("DepthToSpace", DepthToSpaceKernel, TypeSet::all());
  registerCpuKernel("SpaceToDepth", SpaceToDepthKernel, TypeSet::all());
}

} // namespace sd::cpu
