// CPU kernel for Resize: nearest, (multi)linear and cubic interpolation (also
// antialiased) with every ONNX coordinate transformation mode. Each axis is
// resolved to taps (input index, weight) once; the output is a separable
// weighted sum.
#include "cpu_util.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace sd::cpu {
namespace {

struct AxisTaps {
  int taps = 1;
  std::vector<int64_t> index; // [out * taps]
  std::vector<double> weight; // [out * taps]
  std::vector<uint8_t> outside; // tf_crop_and_resize: extrapolate this output position
};

// `out` is the resized length as ONNX's reference defines it: in * scale when
// scales are given (possibly fractional), else the output size.
double originalCoordinate(const std::string &mode, double x, double scale, int64_t in, double out, double roiStart,
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
void antialiasTaps(const AttrMap &a, double x, int64_t in, double scale, int64_t o, AxisTaps &t) {
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

Status axisTaps(const AttrMap &a, int64_t in, int64_t out, double scale, bool scaleGiven, double roiStart,
                double roiEnd, AxisTaps &t) {
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

Status ResizeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t r = x.rank();
  std::vector<int64_t> axes = c.attrs.getInts("axes");
  if (axes.empty())
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  std::vector<double> scales(size_t(r), 1.0), roiS(size_t(r), 0.0), roiE(size_t(r), 1.0);
  std::vector<double> given, roi;
  bool haveScales = c.hasInput(2) && c.inputs[2].data && c.inputs[2].numElements() > 0;
  if (haveScales) readDoubles(c.inputs[2], given);
  if (c.hasInput(1) && c.inputs[1].data) readDoubles(c.inputs[1], roi);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
    SD_CHECK_ARG(a >= 0 && a < r, "Resize axis out of range");
    scales[size_t(a)] = haveScales && i < given.size() ? given[i]
                                                       : double(y.dims[size_t(a)]) / double(x.dims[size_t(a)]);
    if (roi.size() == 2 * axes.size()) {
      roiS[size_t(a)] = roi[i];
      roiE[size_t(a)] = roi[i + axes.size()];
    }
  }
  std::vector<AxisTaps> taps(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) {
    SD_CHECK_ARG(x.dims[size_t(d)] > 0 || y.dims[size_t(d)] == 0, "Resize of an empty axis");
    SD_RETURN_IF_ERROR(axisTaps(c.attrs, x.dims[size_t(d)], y.dims[size_t(d)], scales[size_t(d)], haveScales,
                                roiS[size_t(d)], roiE[size_t(d)], taps[size_t(d)]));
  }
  double extrapolation = c.attrs.getFloat("extrapolation_value", 0.0);
  Dims xs = stridesOf(x.dims);
  if (r == 0) { // a scalar resizes to itself
    std::memcpy(c.outputs[0].data, x.data, x.byteSize());
    return Status::ok();
  }
  // Row by row over the last axis, rows in parallel: each row's leading-axis
  // tap combinations are resolved once, and the last axis is a contiguous
  // loop. Sums run in the order of the per-element definition (leading taps
  // outer, last-axis taps inner), so the result does not depend on the threads.
  const int64_t last = r - 1, width = y.dims[size_t(last)], n = y.numElements();
  const int64_t rows = width ? n / width : 0;
  const AxisTaps &tl = taps[size_t(last)];
  bool nearest = true; // every tap one input at weight 1: a gather
  for (const AxisTaps &t : taps) nearest = nearest && t.taps == 1;
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>();
    T *py = y.as<T>();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width * tl.taps));
    parallelFor(c.pool, rows, grain, [&](int64_t r0, int64_t r1) {
      Dims o(static_cast<size_t>(last));
      std::vector<int> k(static_cast<size_t>(last));
      std::vector<double> acc(static_cast<size_t>(width));
      for (int64_t row = r0; row < r1; ++row) {
        T *out = py + row * width;
        bool outside = false;
        for (int64_t d = last - 1, rem = row; d >= 0; --d) {
          o[size_t(d)] = rem % y.dims[size_t(d)];
          rem /= y.dims[size_t(d)];
          outside = outside || taps[size_t(d)].outside[size_t(o[size_t(d)])];
        }
        if (outside) {
          std::fill(out, out + width, T(extrapolation));
          continue;
        }
        std::fill(k.begin(), k.end(), 0);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (;;) {
          double wl = 1;
          int64_t off = 0;
          for (int64_t d = 0; d < last; ++d) {
            const AxisTaps &t = taps[size_t(d)];
            size_t at = size_t(o[size_t(d)] * t.taps + k[size_t(d)]);
            wl *= t.weight[at];
            off += t.index[at] * xs[size_t(d)];
          }
          const T *in = px + off;
          const int64_t step = xs[size_t(last)];
          if (nearest) {
            for (int64_t j = 0; j < width; ++j)
              out[j] = tl.outside[size_t(j)] ? T(extrapolation) : in[tl.index[size_t(j)] * step];
            break;
          }
          for (int64_t j = 0; j < width; ++j)
            for (int kk = 0; kk < tl.taps; ++kk) {
              size_t at = size_t(j * tl.taps + kk);
              double w = wl * tl.weight[at];
              if (w != 0) acc[size_t(j)] += w * double(in[tl.index[at] * step]);
            }
          int64_t d = last - 1;
          for (; d >= 0; --d) {
            if (++k[size_t(d)] < taps[size_t(d)].taps) break;
            k[size_t(d)] = 0;
          }
          if (d < 0) break;
        }
        if (!nearest)
          for (int64_t j = 0; j < width; ++j)
            out[j] = tl.outside[size_t(j)] ? T(extrapolation) : T(acc[size_t(j)]);
      }
    });
    return Status::ok();
  });
}

} // namespace

void registerResizeKernels() { registerCpuKernel("Resize", ResizeKernel, TypeSet::floats()); }

} // namespace sd::cpu
