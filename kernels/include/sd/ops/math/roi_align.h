// RoiAlign's sampling math, shared by the CPU and CUDA kernels (as
// onnx/reference computes it): a region of interest split into bins, each bin
// sampled on a grid of points, each point read by bilinear interpolation.
#pragma once
#include "sd/ops/attrs.h"
#include "sd/ops/math/host_device.h"
#include <cmath>
#include <cstdint>

namespace sd::math {

// The four pixels a sample reads (row-major offsets in its plane) and their weights; all zero outside the image.
struct RoiTap {
  int64_t pos[4] = {0, 0, 0, 0};
  double w[4] = {0, 0, 0, 0};
};

SD_HD RoiTap bilinearTap(double y, double x, int64_t height, int64_t width) {
  RoiTap t;
  if (y < -1.0 || y > double(height) || x < -1.0 || x > double(width)) return t;
  y = y < 0.0 ? 0.0 : y, x = x < 0.0 ? 0.0 : x; // std::max's choice, NaN included
  int64_t y0 = int64_t(y), x0 = int64_t(x), y1, x1;
  if (y0 >= height - 1) y1 = y0 = height - 1, y = double(y0);
  else y1 = y0 + 1;
  if (x0 >= width - 1) x1 = x0 = width - 1, x = double(x0);
  else x1 = x0 + 1;
  const double ly = y - double(y0), lx = x - double(x0), hy = 1 - ly, hx = 1 - lx;
  t.pos[0] = y0 * width + x0, t.pos[1] = y0 * width + x1, t.pos[2] = y1 * width + x0, t.pos[3] = y1 * width + x1;
  t.w[0] = hy * hx, t.w[1] = hy * lx, t.w[2] = ly * hx, t.w[3] = ly * lx;
  return t;
}

// A region's corner, bin size and sampling grid. half_pixel shifts
// coordinates by -0.5 and does not widen small regions to one pixel.
struct RoiRegion {
  double x0, y0, binH, binW;
  int64_t gridH, gridW;

  // Sample (iy, ix) of bin (i, j).
  SD_HD RoiTap tap(int64_t i, int64_t j, int64_t iy, int64_t ix, int64_t height, int64_t width) const {
    return bilinearTap(y0 + double(i) * binH + (double(iy) + 0.5) * binH / double(gridH),
                       x0 + double(j) * binW + (double(ix) + 0.5) * binW / double(gridW), height, width);
  }
  // An avg bin's divisor.
  SD_HD double samples() const { return double(gridH * gridW > 1 ? gridH * gridW : 1); }
};

// The node's attributes: spatial_scale, sampling_ratio (0: adaptive),
// coordinate_transformation_mode half_pixel, mode max.
struct RoiAttributes {
  double scale;
  int64_t ratio;
  bool halfPixel, maxMode;
};
inline RoiAttributes roiAttributesOf(const AttrMap &attrs) {
  return {attrs.getFloat("spatial_scale", 1.0), attrs.getInt("sampling_ratio", 0),
          attrs.getString("coordinate_transformation_mode", "half_pixel") == "half_pixel",
          attrs.getString("mode", "avg") == "max"};
}

// box: x1, y1, x2, y2 in the input's coordinates before spatial_scale; the
// output bins are ph x pw.
SD_HD RoiRegion roiRegion(double bx1, double by1, double bx2, double by2, const RoiAttributes &a, int64_t ph,
                          int64_t pw) {
  const double shift = a.halfPixel ? 0.5 : 0.0;
  const double x0 = bx1 * a.scale - shift, y0 = by1 * a.scale - shift;
  double rw = bx2 * a.scale - shift - x0, rh = by2 * a.scale - shift - y0;
  if (!a.halfPixel) rw = rw < 1.0 ? 1.0 : rw, rh = rh < 1.0 ? 1.0 : rh;
  return {x0, y0, rh / double(ph), rw / double(pw), a.ratio > 0 ? a.ratio : int64_t(std::ceil(rh / double(ph))),
          a.ratio > 0 ? a.ratio : int64_t(std::ceil(rw / double(pw)))};
}

// Adds sample s of a bin to acc: the weighted sum (avg), or the largest
// weighted pixel so far (max: the first one at s = 0, as std::max keeps the first).
template <typename T> SD_HD double addRoiSample(double acc, int64_t s, const RoiTap &t, const T *plane, bool maxMode) {
  if (!maxMode) {
    for (int q = 0; q < 4; ++q) acc += t.w[q] * double(plane[t.pos[q]]);
    return acc;
  }
  double v = t.w[0] * double(plane[t.pos[0]]);
  for (int q = 1; q < 4; ++q) {
    const double u = t.w[q] * double(plane[t.pos[q]]);
    if (v < u) v = u;
  }
  return s == 0 || acc < v ? v : acc;
}

} // namespace sd::math
