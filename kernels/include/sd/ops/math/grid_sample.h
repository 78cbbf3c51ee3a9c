// GridSample's per-dim sampling math, shared by the CPU and CUDA kernels:
// onnx/reference's (itself PyTorch's GridSampler). A normalized coordinate
// becomes a pixel position, clamped or reflected by the padding mode, then a
// first tap and its weights: 1 tap for nearest (round half to even), 2 for
// linear, 4 for cubic (Keys' a = -0.75). The tensor product of the dims'
// taps is the interpolation.
#pragma once
#include "sd/ops/attrs.h"
#include "sd/ops/math/host_device.h"
#include <cmath>
#include <cstdint>
#include <string>

namespace sd::math {

enum class GridMode { Nearest, Linear, Cubic };
enum class GridPadding { Zeros, Border, Reflection };

// The mode and padding_mode attributes' values (linear and zeros by default).
inline GridMode gridModeNamed(const std::string &m) {
  return m == "nearest" ? GridMode::Nearest : (m == "cubic" || m == "bicubic") ? GridMode::Cubic : GridMode::Linear;
}
inline GridPadding gridPaddingNamed(const std::string &p) {
  return p == "border" ? GridPadding::Border : p == "reflection" ? GridPadding::Reflection : GridPadding::Zeros;
}

SD_HD int gridTaps(GridMode m) { return m == GridMode::Nearest ? 1 : m == GridMode::Linear ? 2 : 4; }

// x reflected into [lo, hi] as often as it takes; *slope (when given) is the
// result's derivative in x: -1 after an odd number of reflections, else 1.
SD_HD double reflectInto(double x, double lo, double hi, double *slope = nullptr) {
  const double range = hi - lo;
  if (slope) *slope = 1.0;
  if (range <= 0) {
    if (slope) *slope = 0.0;
    return lo;
  }
  if (x < lo) {
    const double dx = lo - x;
    const int64_t n = int64_t(dx / range);
    const double r = dx - double(n) * range;
    if (slope) *slope = n % 2 == 0 ? -1.0 : 1.0;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi;
    const int64_t n = int64_t(dx / range);
    const double r = dx - double(n) * range;
    if (slope) *slope = n % 2 == 0 ? -1.0 : 1.0;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

// Keys' cubic convolution weights (a = -0.75) of taps -1, 0, 1, 2 at fraction t.
SD_HD void cubicWeights(double t, double w[4]) {
  const double a = -0.75;
  double x = t + 1;
  w[0] = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  w[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
  x = 1 - t;
  w[2] = ((a + 2) * x - (a + 3)) * x * x + 1;
  x = 2 - t;
  w[3] = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
}

// The derivatives of cubicWeights in t.
SD_HD void cubicSlopes(double t, double dw[4]) {
  const double a = -0.75;
  double x = t + 1;
  dw[0] = (3 * a * x - 10 * a) * x + 8 * a;
  dw[1] = (3 * (a + 2) * t - 2 * (a + 3)) * t;
  x = 1 - t;
  dw[2] = -((3 * (a + 2) * x - 2 * (a + 3)) * x);
  x = 2 - t;
  dw[3] = -((3 * a * x - 10 * a) * x + 8 * a);
}

// One spatial dim of `len` pixels as GridSample samples it.
struct GridAxis {
  int64_t len;
  GridMode mode;
  GridPadding padding;
  bool alignCorners;
  SD_HD double lo() const { return alignCorners ? 0.0 : -0.5; }
  SD_HD double hi() const { return alignCorners ? double(len - 1) : double(len) - 0.5; }

  // The first tap of normalized coordinate `nrm` ([-1, 1] spans the dim) and
  // the taps' weights, w[0 .. gridTaps(mode)). The gradient (GridSampleGrad)
  // also asks for the weights' slopes in the pixel position (dw) and the
  // position's slope in nrm (dvdn: 0 where border padding clamped it, its
  // sign flipped by each reflection; nearest has none, as in PyTorch).
  SD_HD int64_t taps(double nrm, double w[4], double *dw = nullptr, double *dvdn = nullptr) const {
    const double n = double(len);
    double v = alignCorners ? (nrm + 1) / 2.0 * (n - 1) : ((nrm + 1) * n - 1) / 2.0;
    double slope = alignCorners ? (n - 1) / 2.0 : n / 2.0;
    if (mode == GridMode::Nearest) v = std::nearbyint(v), slope = 0.0;
    if (v < lo() || v > hi()) {
      if (padding == GridPadding::Border) v = std::fmin(std::fmax(v, 0.0), n - 1), slope = 0.0;
      else if (padding == GridPadding::Reflection) {
        double flip;
        v = reflectInto(v, lo(), hi(), &flip);
        slope *= flip;
      }
    }
    if (dvdn) *dvdn = slope;
    if (mode == GridMode::Nearest) {
      w[0] = 1.0;
      if (dw) dw[0] = 0.0;
      return int64_t(v);
    }
    const double f = std::floor(v), t = v - f;
    if (mode == GridMode::Linear) {
      w[0] = 1 - t, w[1] = t;
      if (dw) dw[0] = -1.0, dw[1] = 1.0;
      return int64_t(f);
    }
    cubicWeights(t, w);
    if (dw) cubicSlopes(t, dw);
    return int64_t(f) - 1;
  }

  // Tap index i, padded: in [0, len), or -1 where zero padding reads a zero.
  SD_HD int64_t padded(int64_t i) const {
    if (i >= 0 && i < len) return i;
    if (padding == GridPadding::Zeros) return -1;
    if (padding == GridPadding::Border) return i < 0 ? 0 : len - 1;
    const int64_t r = int64_t(reflectInto(double(i), lo(), hi()));
    return r < 0 ? 0 : r >= len ? len - 1 : r;
  }
};

constexpr int kMaxGridGradDims = 3;

// One output point's share of GridSample's gradient on one (batch, channel)
// plane, its taps' first indices and weights (w) and slopes (dw) per dim
// given: dy·w added to each tap's dx (when dxPlane is given), and, per dim
// d, dy·x·(the weights' product differentiated along d) added to dpos[d]
// (when given). The CPU and CUDA kernels share it, so both sum in one order:
// the last dim's tap turns fastest.
template <typename T>
SD_HD void gridTapsGrad(const GridAxis *axes, int k, const int64_t *first, const double (*w)[4],
                        const double (*dw)[4], double dy, const T *plane, T *dxPlane, double *dpos) {
  const int taps = gridTaps(axes[0].mode);
  int combos = 1;
  for (int d = 0; d < k; ++d) combos *= taps;
  for (int combo = 0; combo < combos; ++combo) {
    int tap[kMaxGridGradDims];
    for (int d = k - 1, rest = combo; d >= 0; --d, rest /= taps) tap[d] = rest % taps;
    int64_t offset = 0;
    bool inside = true;
    for (int d = 0; d < k && inside; ++d) {
      const int64_t j = axes[d].padded(first[d] + tap[d]);
      inside = j >= 0;
      offset = offset * axes[d].len + j;
    }
    if (!inside) continue;
    double weight = 1.0;
    for (int d = 0; d < k; ++d) weight *= w[d][tap[d]];
    if (dxPlane) dxPlane[offset] += T(weight * dy);
    if (!dpos) continue;
    const double xv = dy * double(plane[offset]);
    for (int d = 0; d < k; ++d) {
      double slope = dw[d][tap[d]];
      for (int e = 0; e < k; ++e)
        if (e != d) slope *= w[e][tap[e]];
      dpos[d] += slope * xv;
    }
  }
}

// A GridSample node's spatial dim of `len` pixels, as its mode,
// padding_mode and align_corners attributes sample it.
inline GridAxis gridAxisOf(const AttrMap &attrs, int64_t len) {
  return {len, gridModeNamed(attrs.getString("mode", "linear")),
          gridPaddingNamed(attrs.getString("padding_mode", "zeros")), attrs.getInt("align_corners", 0) != 0};
}

// AffineGrid's normalized coordinate of pixel i of a `size`-pixel dim.
SD_HD double affineGridCoordinate(int64_t i, int64_t size, bool alignCorners) {
  if (alignCorners) return size > 1 ? -1.0 + 2.0 * double(i) / double(size - 1) : -1.0;
  return -1.0 + (2.0 * double(i) + 1.0) / double(size);
}

} // namespace sd::math
