// CPU kernels of AffineGrid, of GridSample's gradient (up to 3 spatial dims,
// as PyTorch's), and of GridSample over any number of spatial dims, following
// onnx/reference (itself PyTorch's GridSampler): the interpolation is the
// tensor product of per-dim taps, each tap's index padded per dim. The
// per-dim math is shared with the CUDA kernels (sd/ops/math/grid_sample.h).
#include "cpu_util.h"
#include "sd/ops/math/grid_sample.h"
#include <cmath>
#include <vector>

namespace sd::cpu {
namespace {

using math::GridAxis;

// The GridSample node's spatial dims of X (input `xInput`) as it samples them.
std::vector<GridAxis> gridAxes(const KernelContext &c, size_t xInput = 0) {
  std::vector<GridAxis> axes;
  const Dims &dims = c.inputs[xInput].dims;
  for (size_t d = 2; d < dims.size(); ++d) axes.push_back(math::gridAxisOf(c.attrs, dims[d]));
  return axes;
}

template <typename T> Status gridSample(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &grid = c.inputs[1];
  const std::vector<GridAxis> axes = gridAxes(c);
  int64_t k = x.rank() - 2, N = x.dims[0], C = x.dims[1];
  int64_t spatial = 1, points = 1;
  for (const GridAxis &a : axes) spatial *= a.len;
  for (int64_t d = 1; d <= k; ++d) points *= grid.dims[size_t(d)];
  const size_t ks = static_cast<size_t>(k);
  const int taps = math::gridTaps(axes.empty() ? math::GridMode::Nearest : axes[0].mode);
  std::vector<int64_t> first(ks), tap(ks);
  std::vector<double> weight(ks * 4);
  const T *xs = x.as<T>();
  const auto *gs = grid.as<T>();
  T *y = c.outputs[0].as<T>();
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < points; ++p) {
      const T *g = gs + (b * points + p) * k;
      // The grid lists coordinates innermost dim first (x, y[, z]).
      for (int64_t d = 0; d < k; ++d) first[size_t(d)] = axes[size_t(d)].taps(double(g[k - 1 - d]), &weight[size_t(d * 4)]);
      for (int64_t ch = 0; ch < C; ++ch) {
        const T *plane = xs + (b * C + ch) * spatial;
        double acc = 0;
        std::fill(tap.begin(), tap.end(), 0);
        for (bool more = true; more;) {
          double w = 1.0;
          int64_t offset = 0;
          bool inside = true;
          for (int64_t d = 0; d < k && inside; ++d) {
            int64_t i = axes[size_t(d)].padded(first[size_t(d)] + tap[size_t(d)]);
            if (i < 0) inside = false;
            offset = offset * axes[size_t(d)].len + i;
            w *= weight[size_t(d * 4 + tap[size_t(d)])];
          }
          if (inside) acc += w * double(plane[offset]);
          more = false;
          for (int64_t d = k - 1; d >= 0; --d) {
            if (++tap[size_t(d)] < taps) {
              more = true;
              break;
            }
            tap[size_t(d)] = 0;
          }
        }
        y[(b * C + ch) * points + p] = T(acc);
      }
    }
  return Status::ok();
}

Status GridSampleKernel(const KernelContext &c) {
  if (c.inputs[1].dtype != c.inputs[0].dtype) return sdError("GridSample: X and grid must share a float type");
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) { return gridSample<decltype(tag)>(c); });
}

// GridSampleGrad(dy, X, grid) -> (dx, dgrid), one batch image per task:
// per output point, its taps and their slopes, then each channel's share
// (math::gridTapsGrad, summed in the CUDA kernels' order: dx in
// output-point order, dgrid over channels, then taps).
template <typename T> Status gridSampleGrad(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &x = c.inputs[1], &grid = c.inputs[2];
  const std::vector<GridAxis> axes = gridAxes(c, 1);
  const int k = int(axes.size());
  if (k < 1 || k > math::kMaxGridGradDims)
    return sdError("GridSampleGrad samples 1 to ", math::kMaxGridGradDims, " spatial dims, not ", k);
  const int64_t N = x.dims[0], C = x.dims[1];
  int64_t spatial = 1, points = 1;
  for (const GridAxis &a : axes) spatial *= a.len;
  for (int d = 1; d <= k; ++d) points *= grid.dims[size_t(d)];
  T *dx = c.outputs[0].as<T>(), *dgrid = c.outputs[1].as<T>();
  std::fill(dx, dx + N * C * spatial, T(0));
  parallelFor(c.pool, N, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t p = 0; p < points; ++p) {
        const T *g = grid.as<T>() + (b * points + p) * k;
        int64_t first[math::kMaxGridGradDims];
        double w[math::kMaxGridGradDims][4], dw[math::kMaxGridGradDims][4], dvdn[math::kMaxGridGradDims];
        // The grid lists coordinates innermost dim first (x, y[, z]).
        for (int d = 0; d < k; ++d) first[d] = axes[size_t(d)].taps(double(g[k - 1 - d]), w[d], dw[d], &dvdn[d]);
        double dpos[math::kMaxGridGradDims] = {};
        for (int64_t ch = 0; ch < C; ++ch) {
          const int64_t plane = (b * C + ch) * spatial;
          math::gridTapsGrad(axes.data(), k, first, w, dw, double(dy.as<T>()[(b * C + ch) * points + p]),
                             x.as<T>() + plane, dx + plane, dpos);
        }
        for (int d = 0; d < k; ++d) dgrid[(b * points + p) * k + (k - 1 - d)] = T(dpos[d] * dvdn[d]);
      }
  });
  return Status::ok();
}

Status GridSampleGradKernel(const KernelContext &c) {
  if (c.inputs[0].dtype != c.inputs[1].dtype || c.inputs[2].dtype != c.inputs[1].dtype)
    return sdError("GridSampleGrad: dy, X and grid must share a float type");
  return dispatchFloat(c.inputs[1].dtype, [&](auto tag) { return gridSampleGrad<decltype(tag)>(c); });
}

} // namespace

namespace {

// AffineGrid: the sampling grid GridSample takes, theta [N, k, k+1] applied to
// the normalized homogeneous coordinates (x, y[, z], 1) of each output pixel.
template <typename T> Status affineGrid(const KernelContext &c) {
  const TensorView &theta = c.inputs[0], &o = c.outputs[0];
  bool align = c.attrs.getInt("align_corners", 0) != 0;
  int64_t k = o.dims.back(), n = o.dims[0];
  Dims spatial(o.dims.begin() + 1, o.dims.end() - 1); // [H, W] or [D, H, W]
  int64_t points = product(spatial);
  const T *pt = theta.as<T>();
  T *po = o.as<T>();
  std::vector<double> homo(size_t(k + 1));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t p = 0; p < points; ++p) {
      // Coordinate j of the homogeneous vector runs along spatial dim k-1-j (x is the last dim).
      for (int64_t j = 0, rem = p; j < k; ++j) {
        int64_t size = spatial[size_t(k - 1 - j)];
        homo[size_t(j)] = math::affineGridCoordinate(rem % size, size, align);
        rem /= size;
      }
      homo[size_t(k)] = 1.0;
      for (int64_t r = 0; r < k; ++r) {
        double acc = 0;
        for (int64_t j = 0; j <= k; ++j) acc += double(pt[(b * k + r) * (k + 1) + j]) * homo[size_t(j)];
        po[(b * points + p) * k + r] = T(acc);
      }
    }
  return Status::ok();
}

Status AffineGridKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) { return affineGrid<decltype(tag)>(c); });
}

} // namespace

void registerGridSampleKernels() {
  registerCpuKernel("GridSample", GridSampleKernel, {DType::F32});
  registerCpuKernel("GridSampleGrad", GridSampleGradKernel, {DType::F32});
  registerCpuKernel("AffineGrid", AffineGridKernel, TypeSet::floats());
}

} // namespace sd::cpu
