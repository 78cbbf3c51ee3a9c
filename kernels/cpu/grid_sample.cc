// CPU kernels of AffineGrid and of GridSample over any number of spatial dims, following
// onnx/reference (itself PyTorch's GridSampler): the interpolation is the
// tensor product of per-dim taps (2 linear, 4 cubic with Keys' a = -0.75, 1
// nearest with round-half-even), each tap's index padded per dim (zeros,
// border clamp, reflection).
#include "cpu_util.h"
#include <cmath>
#include <vector>

namespace sd::cpu {
namespace {

enum class Mode { Nearest, Linear, Cubic };
enum class Padding { Zeros, Border, Reflection };

double reflect(double x, double lo, double hi) {
  double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    double dx = lo - x;
    int64_t n = int64_t(dx / range);
    double r = dx - double(n) * range;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    double dx = x - hi;
    int64_t n = int64_t(dx / range);
    double r = dx - double(n) * range;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

void cubicWeights(double t, double w[4]) {
  const double a = -0.75;
  double x = t + 1;
  w[0] = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  w[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
  x = 1 - t;
  w[2] = ((a + 2) * x - (a + 3)) * x * x + 1;
  x = 2 - t;
  w[3] = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
}

template <typename T> Status gridSample(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &grid = c.inputs[1];
  std::string m = c.attrs.getString("mode", "linear"), pm = c.attrs.getString("padding_mode", "zeros");
  Mode mode = m == "nearest" ? Mode::Nearest : (m == "cubic" || m == "bicubic") ? Mode::Cubic : Mode::Linear;
  Padding pad = pm == "border" ? Padding::Border : pm == "reflection" ? Padding::Reflection : Padding::Zeros;
  bool align = c.attrs.getInt("align_corners", 0) != 0;
  int64_t k = x.rank() - 2, N = x.dims[0], C = x.dims[1];
  std::vector<int64_t> dims(x.dims.begin() + 2, x.dims.end());
  int64_t spatial = 1, points = 1;
  for (int64_t d : dims) spatial *= d;
  for (int64_t d = 1; d <= k; ++d) points *= grid.dims[size_t(d)];
  const size_t ks = static_cast<size_t>(k);
  std::vector<double> lo(ks), hi(ks);
  for (int64_t d = 0; d < k; ++d) {
    lo[size_t(d)] = align ? 0.0 : -0.5;
    hi[size_t(d)] = align ? double(dims[size_t(d)] - 1) : double(dims[size_t(d)]) - 0.5;
  }
  int64_t taps = mode == Mode::Nearest ? 1 : mode == Mode::Linear ? 2 : 4;
  std::vector<int64_t> first(ks), tap(ks);
  std::vector<double> weight(ks * 4);
  const T *xs = x.as<T>();
  const auto *gs = grid.as<T>();
  T *y = c.outputs[0].as<T>();
  // Index of spatial dim d's tap, padded; -1: outside with zero padding.
  auto padded = [&](int64_t d, int64_t i) -> int64_t {
    int64_t n = dims[size_t(d)];
    if (i >= 0 && i < n) return i;
    if (pad == Padding::Zeros) return -1;
    if (pad == Padding::Border) return i < 0 ? 0 : n - 1;
    int64_t r = int64_t(reflect(double(i), lo[size_t(d)], hi[size_t(d)]));
    return r < 0 ? 0 : r >= n ? n - 1 : r;
  };
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < points; ++p) {
      const T *g = gs + (b * points + p) * k;
      for (int64_t d = 0; d < k; ++d) {
        // The grid lists coordinates innermost dim first (x, y[, z]).
        double nrm = double(g[k - 1 - d]), len = double(dims[size_t(d)]);
        double v = align ? (nrm + 1) / 2.0 * (len - 1) : ((nrm + 1) * len - 1) / 2.0;
        if (mode == Mode::Nearest) v = std::nearbyint(v);
        if (v < lo[size_t(d)] || v > hi[size_t(d)]) {
          if (pad == Padding::Border) v = std::fmin(std::fmax(v, 0.0), len - 1);
          else if (pad == Padding::Reflection) v = reflect(v, lo[size_t(d)], hi[size_t(d)]);
        }
        double* w = &weight[size_t(d * 4)];
        if (mode == Mode::Nearest) {
          first[size_t(d)] = int64_t(v), w[0] = 1.0;
        } else {
          double f = std::floor(v), t = v - f;
          if (mode == Mode::Linear) first[size_t(d)] = int64_t(f), w[0] = 1 - t, w[1] = t;
          else first[size_t(d)] = int64_t(f) - 1, cubicWeights(t, w);
        }
      }
      for (int64_t ch = 0; ch < C; ++ch) {
        const T *plane = xs + (b * C + ch) * spatial;
        double acc = 0;
        std::fill(tap.begin(), tap.end(), 0);
        for (bool more = true; more;) {
          double w = 1.0;
          int64_t offset = 0;
          bool inside = true;
          for (int64_t d = 0; d < k && inside; ++d) {
            int64_t i = padded(d, first[size_t(d)] + tap[size_t(d)]);
            if (i < 0) inside = false;
            offset = offset * dims[size_t(d)] + i;
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
  auto coord = [&](int64_t i, int64_t size) {
    if (align) return size > 1 ? -1.0 + 2.0 * double(i) / double(size - 1) : -1.0;
    return -1.0 + (2.0 * double(i) + 1.0) / double(size);
  };
  const T *pt = theta.as<T>();
  T *po = o.as<T>();
  std::vector<double> homo(size_t(k + 1));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t p = 0; p < points; ++p) {
      // Coordinate j of the homogeneous vector runs along spatial dim k-1-j (x is the last dim).
      for (int64_t j = 0, rem = p; j < k; ++j) {
        int64_t size = spatial[size_t(k - 1 - j)];
        homo[size_t(j)] = coord(rem % size, size);
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
  registerCpuKernel("AffineGrid", AffineGridKernel, TypeSet::floats());
}

} // namespace sd::cpu
