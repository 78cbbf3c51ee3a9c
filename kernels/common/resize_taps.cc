// Resize's interpolation taps (sd/ops/resize_taps.h).
#include "sd/ops/resize_taps.h"
#include <algorithm>
#include <cmath>
#include <string>

namespace sd {

// `out` is the resized length as ONNX's reference defines it: in * scale when
// scales are given (possibly fractional), else the output size.
static double originalCoordinate(const std::string &mode, double x, double scale, int64_t in, double out, double roiStart,
                          double roiEnd) {
  if (mode == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (mode == "half_pixel_symmetric") {
    double adjustment = double(out) / (scale * double(in));
    double center = double(in) / 2;  // adjustment uses the integer output size
    return center * (1 - adjustment) + (x + 0.5) / scale - 0.5;
  }
  if (mode == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (mode == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (mode == "align_corners") return out == 1 ? 0.0 : x * double(in - 1) / (out - 1);
  if (mode == "tf_crop_and_resize")
    return out > 1 ? roiStart * double(in - 1) + x * (roiEnd - roiStart) * double(in - 1) / (out - 1)
                   : 0.5 * (roiStart + roiEnd) * double(in - 1);
  return x / scale; // asymmetric
}

// Antialiased linear/cubic (onnx/reference): when downsampling, the filter is
// stretched by 1/scale, so each output reads a window of n inputs; the
// weights are normalized, and the window is placed as the reference places
// it (ties toward the smaller index), edge-clamped.
static void antialiasTaps(const AttrMap &a, double x, int64_t in, double scale, int64_t o, ResizeAxisTaps &t) {
  bool cubic = a.getString("mode", "nearest") == "cubic";
  double A = a.getFloat("cubic_coeff_a", -0.75), s = std::min(scale, 1.0);
  double ratio = x == std::floor(x) ? 1.0 : x - std::floor(x);
  int64_t start = cubic ? int64_t(std::floor(-2 / s)) + 1 : int64_t(std::floor(-1 / s)) + 1;
  int n = int(2 - 2 * start);
  std::vector<double> c(static_cast<size_t>(n));
  double sum = 0;
  for (int k = 0; k < n; ++k) {
    double u = std::fabs(s * (double(start + k) - ratio));
    if (cubic) c[size_t(k)] = u <= 1 ? ((A + 2) * u - (A + 3)) * u * u + 1 : u < 2 ? ((A * u - 5 * A) * u + 8 * A) * u - 4 * A : 0;
    else c[size_t(k)] = std::max(0.0, 1 - u);
    sum += c[size_t(k)];
  }
  int64_t pad = (n + 1) / 2;
  double xp = x + double(pad), p = std::floor(xp), frac = xp - p;
  int64_t offset = n % 2 == 0 ? (frac == 0 ? -(n / 2) : -(n / 2) + 1) : (frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1);
  int64_t first = int64_t(p) + offset - pad;
  bool exclude = a.getInt("exclude_outside", 0);
  double kept = 0;
  for (int k = 0; k < n; ++k) {
    c[size_t(k)] /= sum;
    if (exclude && (first + k < 0 || first + k >= in)) c[size_t(k)] = 0;
    kept += c[size_t(k)];
  }
  for (int k = 0; k < n; ++k) {
    t.index[size_t(o * n + k)] = std::min<int64_t>(std::max<int64_t>(first + k, 0), in - 1);
    t.weight[size_t(o * n + k)] = exclude && kept != 0 ? c[size_t(k)] / kept : c[size_t(k)];
  }
}

static Status axisTaps(const AttrMap &a, int64_t in, int64_t out, double scale, bool scaleGiven, double roiStart,
                double roiEnd, ResizeAxisTaps &t) {
  std::string mode = a.getString("mode", "nearest");
  std::string coord = a.getString("coordinate_transformation_mode", "half_pixel");
  std::string nearest = a.getString("nearest_mode", "round_prefer_floor");
  double cubicA = a.getFloat("cubic_coeff_a", -0.75);
  bool exclude = a.getInt("exclude_outside", 0);
  t.taps = mode == "nearest" ? 1 : mode == "linear" ? 2 : 4;
  bool antialias = a.getInt("antialias", 0) && mode != "nearest";
  if (antialias) { // the window widens with 1/scale when downsampling
    double s = std::min(scale, 1.0);
    int64_t start = mode == "cubic" ? int64_t(std::floor(-2 / s)) + 1 : int64_t(std::floor(-1 / s)) + 1;
    t.taps = int(2 - 2 * start);
  }
  t.index.assign(size_t(out * t.taps), 0);
  t.weight.assign(size_t(out * t.taps), 0.0);
  t.outside.assign(size_t(out), 0);
  for (int64_t o = 0; o < out; ++o) {
    double length = scaleGiven ? scale * double(in) : double(out);
    double x = coord == "half_pixel_symmetric"
                   ? originalCoordinate(coord, double(o), scale, in, double(out), roiStart, roiEnd)
                   : originalCoordinate(coord, double(o), scale, in, length, roiStart, roiEnd);
    if (coord == "tf_crop_and_resize" && (x < 0 || x > double(in - 1))) t.outside[size_t(o)] = 1;
    if (antialias) {
      antialiasTaps(a, x, in, scale, o, t);
      continue;
    }
    int64_t *idx = &t.index[size_t(o * t.taps)];
    double *w = &t.weight[size_t(o * t.taps)];
    auto clampIdx = [&](int64_t i) { return std::min<int64_t>(std::max<int64_t>(i, 0), in - 1); };
    if (mode == "nearest") {
      int64_t i;
      if (nearest == "floor") i = int64_t(std::floor(x));
      else if (nearest == "ceil") i = int64_t(std::ceil(x));
      else if (nearest == "round_prefer_ceil") i = int64_t(std::floor(x + 0.5));
      else i = (x == std::floor(x) + 0.5) ? int64_t(std::floor(x)) : int64_t(std::round(x));
      idx[0] = clampIdx(i);
      w[0] = 1;
    } else if (mode == "linear") {
      double xc = std::min(std::max(x, 0.0), double(in - 1));
      int64_t i0 = int64_t(std::floor(xc));
      double f = xc - double(i0);
      idx[0] = clampIdx(i0);
      idx[1] = clampIdx(i0 + 1);
      w[0] = 1 - f;
      w[1] = f;
    } else {
      int64_t i0 = int64_t(std::floor(x));
      double tt = x - double(i0), A = cubicA;
      double c[4] = {((A * (tt + 1) - 5 * A) * (tt + 1) + 8 * A) * (tt + 1) - 4 * A,
                     ((A + 2) * tt - (A + 3)) * tt * tt + 1,
                     ((A + 2) * (1 - tt) - (A + 3)) * (1 - tt) * (1 - tt) + 1,
                     ((A * (2 - tt) - 5 * A) * (2 - tt) + 8 * A) * (2 - tt) - 4 * A};
      double sum = 0;
      for (int k = 0; k < 4; ++k) {
        int64_t i = i0 - 1 + k;
        if (exclude && (i < 0 || i >= in)) c[k] = 0;
        sum += c[k];
        idx[k] = clampIdx(i);
      }
      for (int k = 0; k < 4; ++k) w[k] = exclude && sum != 0 ? c[k] / sum : c[k];
    }
  }
  return Status::ok();
}

ResizeAxisAdjoint resizeAdjoint(const ResizeAxisTaps &t, int64_t in, int64_t out) {
  ResizeAxisAdjoint a;
  a.identity = in == out && t.taps == 1;
  for (int64_t o = 0; o < out && a.identity; ++o)
    a.identity = t.index[size_t(o)] == o && t.weight[size_t(o)] == 1.0 && !t.outside[size_t(o)];
  std::vector<int64_t> count(size_t(in) + 1, 0);
  auto reads = [&](int64_t o, int k) {
    size_t at = size_t(o * t.taps + k);
    return !t.outside[size_t(o)] && t.weight[at] != 0 && t.index[at] >= 0 && t.index[at] < in;
  };
  for (int64_t o = 0; o < out; ++o)
    for (int k = 0; k < t.taps; ++k)
      if (reads(o, k)) ++count[size_t(t.index[size_t(o * t.taps + k)]) + 1];
  a.start.assign(size_t(in) + 1, 0);
  for (int64_t i = 0; i < in; ++i) a.start[size_t(i) + 1] = a.start[size_t(i)] + count[size_t(i) + 1];
  a.from.resize(size_t(a.start.back()));
  a.weight.resize(size_t(a.start.back()));
  std::vector<int64_t> fill(a.start.begin(), a.start.end() - 1);
  for (int64_t o = 0; o < out; ++o) // in output order, so each input's entries are too
    for (int k = 0; k < t.taps; ++k)
      if (reads(o, k)) {
        size_t at = size_t(o * t.taps + k), to = size_t(fill[size_t(t.index[at])]++);
        a.from[to] = o;
        a.weight[to] = t.weight[at];
      }
  return a;
}

Status resizeTaps(const AttrMap &attrs, const Dims &in, const Dims &out, const std::vector<double> &roi,
                  const std::vector<double> &given, std::vector<ResizeAxisTaps> &taps) {
  const int64_t r = int64_t(in.size());
  std::vector<int64_t> axes = attrs.getInts("axes");
  if (axes.empty())
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  std::vector<double> scales(size_t(r), 1.0), roiS(size_t(r), 0.0), roiE(size_t(r), 1.0);
  const bool haveScales = !given.empty();
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
    if (a < 0 || a >= r) return sdError("Resize axis ", axes[i], " out of range for rank ", r);
    scales[size_t(a)] = haveScales && i < given.size() ? given[i] : double(out[size_t(a)]) / double(in[size_t(a)]);
    if (roi.size() == 2 * axes.size()) {
      roiS[size_t(a)] = roi[i];
      roiE[size_t(a)] = roi[i + axes.size()];
    }
  }
  taps.assign(size_t(r), ResizeAxisTaps{});
  for (int64_t d = 0; d < r; ++d) {
    if (in[size_t(d)] <= 0 && out[size_t(d)] != 0) return sdError("Resize of an empty axis");
    SD_RETURN_IF_ERROR(axisTaps(attrs, in[size_t(d)], out[size_t(d)], scales[size_t(d)], haveScales, roiS[size_t(d)],
                                roiE[size_t(d)], taps[size_t(d)]));
  }
  return Status::ok();
}

} // namespace sd
