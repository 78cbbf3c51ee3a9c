// CUDA kernels that move bytes: Identity (and Reshape, Squeeze, Unsqueeze,
// Flatten where they are steps), Transpose, Concat and Split (as 2-D
// copies), Expand, Tile and DepthToSpace/SpaceToDepth (strided reads), Slice,
// Pad, CenterCropPad, ReverseSequence, Gather (embedding lookup) and GatherGrad (its
// deterministic scatter-add). Kernels that only move bytes run on every type
// by element size.
#include "cuda_util.cuh"
#include "sd/ops/dispatch.h"
#include "sd/ops/index_geometry.h"
#include <memory>

namespace sd::cuda {
namespace {


Status IdentityKernel(const KernelContext &c) {
  return copyTensor(c.inputs[0], c.outputs[0], streamOf(c), "Identity");
}

// out[i] = in[sum idx_d * inStride_d], idx over the output's dims.
struct Gather8 {
  int rank = 0;
  int64_t base = 0;
  int64_t outDims[kMaxRank] = {}, inStrides[kMaxRank] = {};
};

template <typename U> __global__ void stridedCopyKernel(Gather8 g, const U *in, U *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = g.base;
    for (int d = g.rank - 1; d >= 0; --d) {
      off += (rem % g.outDims[d]) * g.inStrides[d];
      rem /= g.outDims[d];
    }
    out[i] = in[off];
  }
}

// The same copy in units of `factor` elements, when the innermost output
// dimension reads contiguous input and every offset is a whole number of
// units (a transpose that keeps the last axis, a slice of whole rows): one
// wide load and store, and one index decode, per unit.
bool widen(Gather8 &g, int64_t factor) {
  const int last = g.rank - 1;
  if (last < 0 || g.inStrides[last] != 1 || g.outDims[last] % factor || g.base % factor) return false;
  for (int d = 0; d < last; ++d)
    if (g.outDims[d] != 1 && g.inStrides[d] % factor) return false;
  g.outDims[last] /= factor;
  g.base /= factor;
  for (int d = 0; d < last; ++d) g.inStrides[d] = g.outDims[d] == 1 ? 0 : g.inStrides[d] / factor;
  return true;
}

template <typename U> Status launchStridedCopy(const Gather8 &g, const void *in, void *out, int64_t n, cudaStream_t s,
                                              const char *op) {
  stridedCopyKernel<U><<<blocksFor(n), kThreads, 0, s>>>(g, static_cast<const U *>(in), static_cast<U *>(out), n);
  return launchStatus(op);
}

Status stridedCopy(const Gather8 &g, const TensorView &in, const TensorView &out, cudaStream_t s, const char *op) {
  int64_t n = out.numElements();
  if (n == 0) return Status::ok();
  const int64_t width = int64_t(dtypeSize(out.dtype));
  for (int64_t unit : {16, 8, 4}) {
    Gather8 w = g;
    if (width <= 0 || unit <= width || unit % width || reinterpret_cast<uintptr_t>(in.data) % unit ||
        reinterpret_cast<uintptr_t>(out.data) % unit || !widen(w, unit / width))
      continue;
    const int64_t units = n / (unit / width);
    if (unit == 16) return launchStridedCopy<uint4>(w, in.data, out.data, units, s, op);
    if (unit == 8) return launchStridedCopy<uint2>(w, in.data, out.data, units, s, op);
    return launchStridedCopy<uint32_t>(w, in.data, out.data, units, s, op);
  }
  return dispatchByWidth(out.dtype, [&](auto tag) {
    using U = decltype(tag);
    return launchStridedCopy<U>(g, in.data, out.data, n, s, op);
  });
}

Status TransposeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  std::vector<int64_t> perm = c.attrs.getInts("perm");
  if (perm.empty())
    for (int64_t i = x.rank() - 1; i >= 0; --i) perm.push_back(i);
  return permute(x, c.outputs[0], perm, streamOf(c), "Transpose");
}

Status broadcastCopy(const TensorView &x, const TensorView &o, cudaStream_t s, const char *op) {
  if (x.rank() > o.rank() || o.rank() > kMaxRank)
    return sdError(op, " on CUDA cannot broadcast ", formatDims(x.dims), " to ", formatDims(o.dims));
  Gather8 g;
  g.rank = int(o.rank());
  int64_t stride = 1;
  for (int64_t i = x.rank() - 1; i >= 0; --i) {
    int64_t xd = x.dims[size_t(i)], od = o.dims[size_t(o.rank() - x.rank() + i)];
    if (xd != od && xd != 1) return sdError(op, " cannot broadcast ", formatDims(x.dims), " to ", formatDims(o.dims));
    g.inStrides[o.rank() - x.rank() + i] = xd == 1 ? 0 : stride;
    stride *= xd;
  }
  for (int64_t i = 0; i < o.rank(); ++i) g.outDims[i] = o.dims[size_t(i)];
  return stridedCopy(g, x, o, s, op);
}

Status ExpandKernel(const KernelContext &c) { return broadcastCopy(c.inputs[0], c.outputs[0], streamOf(c), "Expand"); }

// A copy the op library describes as a strided read (sd/ops/index_geometry.h).
Status readStrided(const StatusOr<StridedRead> &read, const TensorView &x, const TensorView &y, cudaStream_t s,
                   const char *op) {
  if (!read.isOk()) return read.status();
  const StridedRead &r = read.value();
  if (r.dims.size() > size_t(kMaxRank))
    return sdError(op, " on CUDA reads through up to ", kMaxRank, " strided axes; this one needs ", r.dims.size());
  if (product(r.dims) != y.numElements() || x.dtype != y.dtype) return sdError(op, ": result of another size or type");
  Gather8 g;
  g.rank = int(r.dims.size());
  for (size_t i = 0; i < r.dims.size(); ++i) g.outDims[i] = r.dims[i], g.inStrides[i] = r.strides[i];
  return stridedCopy(g, x, y, s, op);
}

Status TileKernel(const KernelContext &c) {
  return readStrided(tileRead(c.inputs[0].dims, c.outputs[0].dims), c.inputs[0], c.outputs[0], streamOf(c), "Tile");
}

template <bool ToSpace> Status blockRearrangeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  return readStrided(blockRearrangeRead(x.dims, c.attrs.getInt("blocksize", 1),
                                        c.attrs.getString("mode", "DCR") == "CRD", ToSpace),
                     x, c.outputs[0], streamOf(c), ToSpace ? "DepthToSpace" : "SpaceToDepth");
}

// Concat (gather = true) or Split along `axis`: each part is one 2-D copy of
// `outer` rows into (or out of) its column range of the whole.
Status copyAlongAxis(const TensorView &whole, const std::vector<TensorView> &parts, int64_t axis, bool concat,
                     cudaStream_t s) {
  if (axis < 0) axis += whole.rank();
  if (axis < 0 || axis >= whole.rank()) return sdError("axis out of range");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= whole.dims[size_t(d)];
  for (int64_t d = axis + 1; d < whole.rank(); ++d) inner *= whole.dims[size_t(d)];
  size_t esize = dtypeSize(whole.dtype), pitch = size_t(whole.dims[size_t(axis)] * inner) * esize, col = 0;
  for (const TensorView &p : parts) {
    if (!p.data) continue;
    size_t width = size_t(p.dims[size_t(axis)] * inner) * esize;
    if (width && outer) {
      char *w = static_cast<char *>(whole.data) + col;
      cudaError_t e = concat ? cudaMemcpy2DAsync(w, pitch, p.data, width, width, size_t(outer), cudaMemcpyDeviceToDevice, s)
                             : cudaMemcpy2DAsync(p.data, width, w, pitch, width, size_t(outer), cudaMemcpyDeviceToDevice, s);
      SD_RETURN_IF_ERROR(cudaCheck(e, concat ? "Concat" : "Split"));
    }
    col += width;
  }
  return Status::ok();
}

Status ConcatKernel(const KernelContext &c) {
  return copyAlongAxis(c.outputs[0], c.inputs, c.attrs.getInt("axis", 0), true, streamOf(c));
}
Status SplitKernel(const KernelContext &c) {
  return copyAlongAxis(c.inputs[0], c.outputs, c.attrs.getInt("axis", 0), false, streamOf(c));
}

// Slice: the strided view computed from the constant starts/ends/axes/steps
// when the session is created.
struct SlicePrepared : PreparedError {
  Gather8 view;
};

std::shared_ptr<const void> prepareSlice(const PrepareContext &p) {
  auto s = std::make_shared<SlicePrepared>();
  const KernelContext &c = p.kernel;
  std::vector<int64_t> starts, ends, axes, steps;
  if (!hostIntegers(p, 1, starts) || !hostIntegers(p, 2, ends) || !hostIntegers(p, 3, axes) ||
      !hostIntegers(p, 4, steps)) {
    s->error = "Slice on CUDA needs constant starts, ends, axes and steps";
    return s;
  }
  SliceView v;
  Status st = sliceView(c.inputs[0].dims, starts, ends, axes, steps, c.outputs[0].dims, v);
  if (!st.isOk()) s->error = st.message();
  else if (c.outputs[0].rank() > kMaxRank) s->error = "Slice on CUDA takes up to rank 8";
  else {
    s->view.rank = int(c.outputs[0].rank());
    s->view.base = v.base;
    for (int d = 0; d < s->view.rank; ++d) {
      s->view.outDims[d] = c.outputs[0].dims[size_t(d)];
      s->view.inStrides[d] = v.strides[size_t(d)];
    }
  }
  return s;
}

Status SliceKernel(const KernelContext &c) {
  auto *s = static_cast<const SlicePrepared *>(c.prepared);
  if (!s) return sdError("Slice was not prepared");
  if (!s->error.empty()) return sdError(s->error);
  return stridedCopy(s->view, c.inputs[0], c.outputs[0], streamOf(c), "Slice");
}

// Pad: constant, edge, wrap and reflect modes, as the CPU kernel.
enum class PadMode { Constant, Edge, Wrap, Reflect };

struct PadGeometry {
  int rank = 0;
  PadMode mode = PadMode::Constant;
  int64_t outDims[kMaxRank] = {}, inDims[kMaxRank] = {}, inStrides[kMaxRank] = {}, before[kMaxRank] = {};
};

struct PadPrepared : PreparedError {
  PadGeometry g;
};

std::shared_ptr<const void> preparePad(const PrepareContext &p) {
  auto s = std::make_shared<PadPrepared>();
  const KernelContext &c = p.kernel;
  std::vector<int64_t> pads, axes;
  if (!hostIntegers(p, 1, pads) || !hostIntegers(p, 3, axes)) {
    s->error = "Pad on CUDA needs constant pads and axes";
    return s;
  }
  Dims before;
  Status st = padBefore(c.inputs[0].dims, pads, axes, c.outputs[0].dims, before);
  std::string mode = c.attrs.getString("mode", "constant");
  if (!st.isOk()) s->error = st.message();
  else if (c.outputs[0].rank() > kMaxRank) s->error = "Pad on CUDA takes up to rank 8";
  else if (mode != "constant" && mode != "edge" && mode != "wrap" && mode != "reflect")
    s->error = "Pad mode '" + mode + "' is unknown";
  if (!s->error.empty()) return s;
  PadGeometry &g = s->g;
  g.mode = mode == "edge" ? PadMode::Edge : mode == "wrap" ? PadMode::Wrap : mode == "reflect" ? PadMode::Reflect
                                                                                              : PadMode::Constant;
  g.rank = int(c.inputs[0].rank());
  int64_t stride = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    g.inDims[d] = c.inputs[0].dims[size_t(d)];
    g.outDims[d] = c.outputs[0].dims[size_t(d)];
    g.before[d] = before[size_t(d)];
    g.inStrides[d] = stride;
    stride *= g.inDims[d];
    if (g.mode != PadMode::Constant && g.inDims[d] == 0 && g.outDims[d] != 0) s->error = "Pad " + mode + " of an empty axis";
  }
  return s;
}

template <typename U> __global__ void padKernel(PadGeometry g, const U *in, const U *fill, U *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = 0;
    bool outside = false;
    for (int d = g.rank - 1; d >= 0; --d) {
      int64_t j = rem % g.outDims[d] - g.before[d], dim = g.inDims[d];
      rem /= g.outDims[d];
      if (j < 0 || j >= dim) {
        if (g.mode == PadMode::Constant) {
          outside = true;
          continue;
        }
        if (g.mode == PadMode::Edge) j = j < 0 ? 0 : dim - 1;
        else if (g.mode == PadMode::Wrap) j = ((j % dim) + dim) % dim;
        else if (dim == 1) j = 0;
        else {
          int64_t period = 2 * (dim - 1);
          j = ((j % period) + period) % period;
          if (j >= dim) j = period - j;
        }
      }
      off += j * g.inStrides[d];
    }
    out[i] = outside ? (fill ? *fill : U(0)) : in[off];
  }
}

Status PadKernel(const KernelContext &c) {
  auto *s = static_cast<const PadPrepared *>(c.prepared);
  if (!s) return sdError("Pad was not prepared");
  if (!s->error.empty()) return sdError(s->error);
  int64_t n = c.outputs[0].numElements();
  if (n == 0) return Status::ok();
  const void *fill = c.hasInput(2) && c.inputs[2].data && c.inputs[2].numElements() > 0 ? c.inputs[2].data : nullptr;
  return dispatchByWidth(c.inputs[0].dtype, [&](auto tag) {
    using U = decltype(tag);
    padKernel<U><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(s->g, c.inputs[0].as<U>(), static_cast<const U *>(fill),
                                                            c.outputs[0].as<U>(), n);
    return launchStatus("Pad");
  });
}

// Rows of `inner` elements; an index out of [-dim, dim) yields a zero row
// (the CPU kernel refuses it; a GPU cannot stop mid-step to say so).
template <typename U, typename I>
__global__ void gatherKernel(const U *x, const I *idx, U *out, int64_t outer, int64_t dim, int64_t ni, int64_t inner) {
  int64_t n = outer * ni * inner;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t k = i % inner, r = i / inner, j = r % ni, o = r / ni;
    int64_t v = wrapIndex(idx[j], dim);
    out[i] = v >= 0 && v < dim ? x[(o * dim + v) * inner + k] : U(0);
  }
}

Status GatherKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &ind = c.inputs[1], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  if (axis < 0) axis += x.rank();
  const AxisExtent e = extentAround(x.dims, axis);
  int64_t ni = ind.numElements(), n = o.numElements();
  if (n == 0) return Status::ok();
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    return dispatchIndex(ind.dtype, [&](auto itag) {
      using I = decltype(itag);
      gatherKernel<U, I><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(x.as<U>(), ind.as<I>(), o.as<U>(), e.outer,
                                                                      e.len, ni, e.inner);
      return launchStatus("Gather");
    });
  });
}

// Each thread owns one (outer, column) and walks every index in order, so
// repeated indices sum in the same order on every run: no atomics, replay
// equals eager bit for bit (as the CPU kernel does it).
template <typename T, typename I>
__global__ void gatherGradKernel(const T *dy, const I *idx, T *out, int64_t outer, int64_t dim, int64_t ni,
                                 int64_t inner) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < outer * inner;
       t += int64_t(gridDim.x) * blockDim.x) {
    int64_t o = t / inner, k = t % inner;
    for (int64_t j = 0; j < ni; ++j) {
      int64_t v = wrapIndex(idx[j], dim);
      if (v < 0 || v >= dim) continue;
      T *dst = out + (o * dim + v) * inner + k;
      *dst = store<T>(load(*dst) + load(dy[(o * ni + j) * inner + k]));
    }
  }
}

Status GatherGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &ind = c.inputs[1], &o = c.outputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  if (axis < 0) axis += o.rank();
  const AxisExtent e = extentAround(o.dims, axis);
  SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(o.data, 0, o.byteSize(), streamOf(c)), "GatherGrad"));
  if (e.outer * e.inner == 0) return Status::ok();
  return dispatchFloatStorage(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    return dispatchIndex(ind.dtype, [&](auto itag) {
      using I = decltype(itag);
      gatherGradKernel<T, I><<<blocksFor(e.outer * e.inner), kThreads, 0, streamOf(c)>>>(
          dy.as<T>(), ind.as<I>(), o.as<T>(), e.outer, e.len, ind.numElements(), e.inner);
      return launchStatus("GatherGrad");
    });
  });
}

// CenterCropPad: each axis cropped or zero-padded about its center (the
// extra element of an odd change at the end), one thread per output element.
struct CropPad8 {
  int rank = 0;
  int64_t outDims[kMaxRank] = {}, inDims[kMaxRank] = {}, inStrides[kMaxRank] = {}, shift[kMaxRank] = {};
};

template <typename U> __global__ void centerCropPadKernel(CropPad8 g, const U *x, U *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = 0;
    bool inside = true;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t at = rem % g.outDims[d] + g.shift[d]; // source index = output index + shift
      rem /= g.outDims[d];
      inside = inside && at >= 0 && at < g.inDims[d];
      off += at * g.inStrides[d];
    }
    y[i] = inside ? x[off] : U(0);
  }
}

Status CenterCropPadKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  if (x.rank() > kMaxRank || y.rank() != x.rank()) return sdError("CenterCropPad on CUDA takes up to rank ", kMaxRank);
  CropPad8 g;
  g.rank = int(x.rank());
  const Dims strides = rowMajorStrides(x.dims);
  for (int d = 0; d < g.rank; ++d) {
    const int64_t in = x.dims[size_t(d)], out = y.dims[size_t(d)];
    g.outDims[d] = out, g.inDims[d] = in, g.inStrides[d] = strides[size_t(d)];
    g.shift[d] = in >= out ? (in - out) / 2 : -((out - in) / 2);
  }
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  return dispatchByWidth(x.dtype, [&](auto tag) {
    using U = decltype(tag);
    centerCropPadKernel<U><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(g, x.as<U>(), y.as<U>(), n);
    return launchStatus("CenterCropPad");
  });
}

// ReverseSequence: per batch entry b the first sequence_lens[b] steps along
// the time axis reversed, the rest copied. A GPU cannot refuse a length
// outside [0, steps] mid-step, as the CPU does: it is clamped there.
struct SequenceAxes {
  int64_t timeStride, steps, batchStride, batch;
};

template <typename U, typename I>
__global__ void reverseSequenceKernel(SequenceAxes a, const U *x, const I *lens, U *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = (i / a.timeStride) % a.steps, b = (i / a.batchStride) % a.batch;
    int64_t len = int64_t(lens[b]);
    len = len < 0 ? 0 : len > a.steps ? a.steps : len;
    y[i] = x[i + (t < len ? (len - 1 - 2 * t) * a.timeStride : 0)];
  }
}

Status ReverseSequenceKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &lens = c.inputs[1], &y = c.outputs[0];
  const int64_t batchAxis = c.attrs.getInt("batch_axis", 1), timeAxis = c.attrs.getInt("time_axis", 0);
  if (batchAxis < 0 || batchAxis >= x.rank() || timeAxis < 0 || timeAxis >= x.rank() || batchAxis == timeAxis)
    return sdError("ReverseSequence: batch_axis ", batchAxis, " and time_axis ", timeAxis, " do not fit rank ",
                   x.rank());
  if (lens.numElements() != x.dims[size_t(batchAxis)])
    return sdError("ReverseSequence sequence_lens must hold one integer per batch entry");
  const Dims strides = rowMajorStrides(x.dims);
  const SequenceAxes a{strides[size_t(timeAxis)], x.dims[size_t(timeAxis)], strides[size_t(batchAxis)],
                       x.dims[size_t(batchAxis)]};
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  return dispatchIndex(lens.dtype, [&](auto itag) {
    using I = decltype(itag);
    return dispatchByWidth(x.dtype, [&](auto tag) {
      using U = decltype(tag);
      reverseSequenceKernel<U, I><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(a, x.as<U>(), lens.as<I>(), y.as<U>(),
                                                                              n);
      return launchStatus("ReverseSequence");
    });
  });
}

} // namespace

Status permute(const TensorView &x, const TensorView &y, const std::vector<int64_t> &perm, cudaStream_t s,
               const char *op) {
  if (int64_t(perm.size()) != x.rank()) return sdError(op, ": perm length mismatch");
  if (x.rank() > kMaxRank) return sdError(op, " on CUDA takes up to rank ", kMaxRank);
  Gather8 g;
  g.rank = int(x.rank());
  Dims xs = rowMajorStrides(x.dims);
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] < 0 || perm[i] >= x.rank()) return sdError(op, ": perm out of range");
    g.outDims[i] = y.dims[i];
    g.inStrides[i] = xs[size_t(perm[i])];
  }
  return stridedCopy(g, x, y, s, op);
}

Status broadcastInto(const TensorView &src, const TensorView &dst, cudaStream_t stream) {
  return broadcastCopy(src, dst, stream, "broadcast");
}

void registerMovementKernels() {
  registerKernel("Identity", IdentityKernel, TypeSet::all());
  // Where the plan keeps them as steps (not aliases of their input): copies.
  // BitCast: the same bytes under another type (the shape rule checks the widths).
  for (const char *op : {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "BitCast"})
    registerKernel(op, IdentityKernel, TypeSet::all());
  registerKernel("Transpose", TransposeKernel, TypeSet::all());
  registerKernel("CenterCropPad", CenterCropPadKernel, TypeSet::all());
  registerKernel("ReverseSequence", ReverseSequenceKernel, TypeSet::all());
  registerKernel("Expand", ExpandKernel, TypeSet::all());
  registerKernel("Tile", TileKernel, TypeSet::all());
  registerKernel("DepthToSpace", blockRearrangeKernel<true>, TypeSet::all());
  registerKernel("SpaceToDepth", blockRearrangeKernel<false>, TypeSet::all());
  registerKernel("Concat", ConcatKernel, TypeSet::all());
  registerKernel("Split", SplitKernel, TypeSet::all());
  registerKernel("Gather", GatherKernel, TypeSet::all());
  registerKernel("Slice", SliceKernel, TypeSet::all(), prepareSlice);
  registerKernel("Pad", PadKernel, TypeSet::all(), preparePad);
  registerKernel("GatherGrad", GatherGradKernel, floatStorage());
}

} // namespace sd::cuda
