// CUDA kernels of GridSample, its gradient and AffineGrid (see kernels/cpu/grid_sample.cc),
// on up to 3 spatial dims. One thread per output element: it computes its
// point's taps with the CPU's shared math (sd/ops/math/grid_sample.h) and
// sums the tensor product of the taps in the CPU's order, in f64.
#include "cuda_util.cuh"
#include "sd/ops/math/grid_sample.h"
#include <string>

namespace sd::cuda {
namespace {

using math::GridAxis;
constexpr int kMaxGridDims = math::kMaxGridGradDims;

struct GridGeometry {
  int k;
  GridAxis axes[kMaxGridDims];
  int64_t batch, channels, spatial, points;
};

template <typename T> __global__ void gridSampleKernel(GridGeometry g, const T *x, const T *grid, T *y, int64_t n) {
  const int taps = math::gridTaps(g.axes[0].mode);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i % g.points, bc = i / g.points, b = bc / g.channels;
    const T *at = grid + (b * g.points + p) * g.k;
    int64_t first[kMaxGridDims];
    double weight[kMaxGridDims][4];
    // The grid lists coordinates innermost dim first (x, y[, z]).
    for (int d = 0; d < g.k; ++d) first[d] = g.axes[d].taps(double(at[g.k - 1 - d]), weight[d]);
    const T *plane = x + bc * g.spatial;
    int combos = 1;
    for (int d = 0; d < g.k; ++d) combos *= taps;
    double acc = 0;
    for (int combo = 0; combo < combos; ++combo) { // the last dim's tap turns fastest, as on the CPU
      int tap[kMaxGridDims];
      for (int d = g.k - 1, rest = combo; d >= 0; --d, rest /= taps) tap[d] = rest % taps;
      double w = 1.0;
      int64_t offset = 0;
      bool inside = true;
      for (int d = 0; d < g.k && inside; ++d) {
        const int64_t j = g.axes[d].padded(first[d] + tap[d]);
        inside = j >= 0;
        offset = offset * g.axes[d].len + j;
        w *= weight[d][tap[d]];
      }
      if (inside) acc += w * double(plane[offset]);
    }
    y[i] = T(acc);
  }
}

// X's and the grid's geometry as the node's attributes sample them.
StatusOr<GridGeometry> geometryOf(const KernelContext &c, const TensorView &x, const TensorView &grid, const char *op) {
  if (grid.dtype != x.dtype) return sdError(op, ": X and grid must share a float type");
  const int64_t k = x.rank() - 2;
  if (k < 1 || k > kMaxGridDims) return sdError(op, " on CUDA samples 1 to ", kMaxGridDims, " spatial dims, not ", k);
  GridGeometry g{int(k), {}, x.dims[0], x.dims[1], 1, 1};
  for (int d = 0; d < g.k; ++d) {
    g.axes[d] = math::gridAxisOf(c.attrs, x.dims[size_t(d + 2)]);
    g.spatial *= g.axes[d].len;
    g.points *= grid.dims[size_t(d + 1)];
  }
  return g;
}

Status GridSampleKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &grid = c.inputs[1], &y = c.outputs[0];
  StatusOr<GridGeometry> geometry = geometryOf(c, x, grid, "GridSample");
  if (!geometry.isOk()) return geometry.status();
  const GridGeometry &g = geometry.value();
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  gridSampleKernel<float><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(g, x.as<float>(), grid.as<float>(),
                                                                      y.as<float>(), n);
  return launchStatus("GridSample");
}

// GridSampleGrad, summing in the CPU kernel's order (math::gridTapsGrad):
// dx by one thread per (batch, channel) plane walking the output points in
// order (no float atomics: replay equals eager), dgrid by one thread per
// output point summing its channels in order.

// A point's taps, weights and slopes (the grid lists coordinates innermost dim first).
template <typename T> __device__ void gradTaps(const GridGeometry &g, const T *at, int64_t *first, double (*w)[4],
                                               double (*dw)[4], double *dvdn) {
  for (int d = 0; d < g.k; ++d) first[d] = g.axes[d].taps(double(at[g.k - 1 - d]), w[d], dw[d], &dvdn[d]);
}

template <typename T>
__global__ void gridSampleGradInputKernel(GridGeometry g, const T *dy, const T *x, const T *grid, T *dx, int64_t n) {
  for (int64_t bc = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; bc < n; bc += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = bc / g.channels;
    for (int64_t p = 0; p < g.points; ++p) {
      int64_t first[kMaxGridDims];
      double w[kMaxGridDims][4], dw[kMaxGridDims][4], dvdn[kMaxGridDims];
      gradTaps(g, grid + (b * g.points + p) * g.k, first, w, dw, dvdn);
      math::gridTapsGrad<T>(g.axes, g.k, first, w, dw, double(dy[bc * g.points + p]), x + bc * g.spatial,
                            dx + bc * g.spatial, nullptr);
    }
  }
}

template <typename T>
__global__ void gridSampleGradGridKernel(GridGeometry g, const T *dy, const T *x, const T *grid, T *dgrid, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / g.points, p = i % g.points;
    int64_t first[kMaxGridDims];
    double w[kMaxGridDims][4], dw[kMaxGridDims][4], dvdn[kMaxGridDims], dpos[kMaxGridDims] = {};
    gradTaps(g, grid + i * g.k, first, w, dw, dvdn);
    for (int64_t ch = 0; ch < g.channels; ++ch) {
      const int64_t bc = b * g.channels + ch;
      math::gridTapsGrad<T>(g.axes, g.k, first, w, dw, double(dy[bc * g.points + p]), x + bc * g.spatial,
                            static_cast<T *>(nullptr), dpos);
    }
    for (int d = 0; d < g.k; ++d) dgrid[i * g.k + (g.k - 1 - d)] = T(dpos[d] * dvdn[d]);
  }
}

Status GridSampleGradKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[1], &grid = c.inputs[2], &dx = c.outputs[0], &dgrid = c.outputs[1];
  if (c.inputs[0].dtype != x.dtype) return sdError("GridSampleGrad: dy and X must share a float type");
  StatusOr<GridGeometry> geometry = geometryOf(c, x, grid, "GridSampleGrad");
  if (!geometry.isOk()) return geometry.status();
  const GridGeometry &g = geometry.value();
  cudaStream_t stream = streamOf(c);
  if (dx.numElements()) SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(dx.data, 0, dx.byteSize(), stream), "GridSampleGrad"));
  const int64_t planes = g.batch * g.channels, points = g.batch * g.points;
  if (points == 0) return Status::ok();
  if (planes) {
    gridSampleGradInputKernel<float><<<blocksFor(planes), kThreads, 0, stream>>>(
        g, c.inputs[0].as<float>(), x.as<float>(), grid.as<float>(), dx.as<float>(), planes);
    SD_RETURN_IF_ERROR(launchStatus("GridSampleGrad"));
  }
  gridSampleGradGridKernel<float><<<blocksFor(points), kThreads, 0, stream>>>( // zeros when there are no channels
      g, c.inputs[0].as<float>(), x.as<float>(), grid.as<float>(), dgrid.as<float>(), points);
  return launchStatus("GridSampleGrad");
}

// AffineGrid: theta [N, k, k+1] applied to each output pixel's normalized
// homogeneous coordinates (x, y[, z], 1); one thread per grid element.
struct AffineGeometry {
  int k;
  bool alignCorners;
  int64_t spatial[kMaxGridDims], points;
};

template <typename T> __global__ void affineGridKernel(AffineGeometry g, const T *theta, T *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i % g.k, p = (i / g.k) % g.points, b = i / (g.k * g.points);
    double homo[kMaxGridDims + 1];
    // Coordinate j runs along spatial dim k-1-j (x is the last dim).
    for (int64_t j = 0, rest = p; j < g.k; ++j) {
      const int64_t size = g.spatial[g.k - 1 - j];
      homo[j] = math::affineGridCoordinate(rest % size, size, g.alignCorners);
      rest /= size;
    }
    homo[g.k] = 1.0;
    double acc = 0;
    for (int j = 0; j <= g.k; ++j) acc += double(theta[(b * g.k + r) * (g.k + 1) + j]) * homo[j];
    out[i] = T(acc);
  }
}

Status AffineGridKernel(const KernelContext &c) {
  const TensorView &o = c.outputs[0];
  const int64_t k = o.dims.back();
  if (k < 1 || k > kMaxGridDims || o.rank() != k + 2)
    return sdError("AffineGrid on CUDA makes grids of 1 to ", kMaxGridDims, " spatial dims");
  AffineGeometry g{int(k), c.attrs.getInt("align_corners", 0) != 0, {}, 1};
  for (int d = 0; d < g.k; ++d) g.points *= g.spatial[d] = o.dims[size_t(d + 1)];
  const int64_t n = o.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) < sizeof(float)) return sdError("AffineGrid on CUDA computes f32 and f64");
    else {
      affineGridKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(g, c.inputs[0].as<T>(), o.as<T>(), n);
      return launchStatus("AffineGrid");
    }
  });
}

} // namespace

void registerGridSampleKernels() {
  registerKernel("GridSample", GridSampleKernel, {DType::F32});
  registerKernel("GridSampleGrad", GridSampleGradKernel, {DType::F32});
  registerKernel("AffineGrid", AffineGridKernel, {DType::F32, DType::F64});
}

} // namespace sd::cuda
