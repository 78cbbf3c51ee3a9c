// RoiAlign (opsets 10 and 16) on CPU, as onnx/reference computes it: each
// output bin of a region averages (or maxes) bilinear samples on a
// sampling_ratio (or adaptive) grid; half_pixel shifts coordinates by -0.5
// and does not widen small regions to one pixel.
#include "cpu_util.h"
#include <algorithm>
#include <cmath>
#include <vector>

namespace sd::cpu {
namespace {

struct Tap {
  int64_t pos[4] = {0, 0, 0, 0};
  double w[4] = {0, 0, 0, 0};
};

Tap bilinearTap(double y, double x, int64_t height, int64_t width) {
  Tap t;
  if (y < -1.0 || y > double(height) || x < -1.0 || x > double(width)) return t;
  y = std::max(y, 0.0), x = std::max(x, 0.0);
  int64_t y0 = int64_t(y), x0 = int64_t(x), y1, x1;
  if (y0 >= height - 1) y1 = y0 = height - 1, y = double(y0);
  else y1 = y0 + 1;
  if (x0 >= width - 1) x1 = x0 = width - 1, x = double(x0);
  else x1 = x0 + 1;
  double ly = y - double(y0), lx = x - double(x0), hy = 1 - ly, hx = 1 - lx;
  t.pos[0] = y0 * width + x0, t.pos[1] = y0 * width + x1, t.pos[2] = y1 * width + x0, t.pos[3] = y1 * width + x1;
  t.w[0] = hy * hx, t.w[1] = hy * lx, t.w[2] = ly * hx, t.w[3] = ly * lx;
  return t;
}

template <typename T> Status roiAlign(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &rois = c.inputs[1], &o = c.outputs[0];
  std::vector<int64_t> batchOf;
  SD_CHECK_ARG(readIntegers(c.inputs[2], batchOf), "RoiAlign batch_indices must be integers");
  bool halfPixel = c.attrs.getString("coordinate_transformation_mode", "half_pixel") == "half_pixel";
  bool maxMode = c.attrs.getString("mode", "avg") == "max";
  double scale = c.attrs.getFloat("spatial_scale", 1.0);
  int64_t ratio = c.attrs.getInt("sampling_ratio", 0);
  int64_t channels = x.dims[1], height = x.dims[2], width = x.dims[3], ph = o.dims[2], pw = o.dims[3];
  const T *pr = rois.as<T>();
  for (int64_t n = 0; n < o.dims[0]; ++n) {
    int64_t b = batchOf[size_t(n)];
    SD_CHECK_ARG(b >= 0 && b < x.dims[0], "RoiAlign batch index ", b, " out of range [0, ", x.dims[0], ")");
    double shift = halfPixel ? 0.5 : 0.0;
    double x0 = double(pr[n * 4]) * scale - shift, y0 = double(pr[n * 4 + 1]) * scale - shift;
    double rw = double(pr[n * 4 + 2]) * scale - shift - x0, rh = double(pr[n * 4 + 3]) * scale - shift - y0;
    if (!halfPixel) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
    double bh = rh / double(ph), bw = rw / double(pw);
    int64_t gh = ratio > 0 ? ratio : int64_t(std::ceil(rh / double(ph)));
    int64_t gw = ratio > 0 ? ratio : int64_t(std::ceil(rw / double(pw)));
    double count = double(std::max<int64_t>(gh * gw, 1));
    std::vector<Tap> taps;
    taps.reserve(size_t(ph * pw * gh * gw));
    for (int64_t i = 0; i < ph; ++i)
      for (int64_t j = 0; j < pw; ++j)
        for (int64_t iy = 0; iy < gh; ++iy)
          for (int64_t ix = 0; ix < gw; ++ix)
            taps.push_back(bilinearTap(y0 + double(i) * bh + (double(iy) + 0.5) * bh / double(gh),
                                       x0 + double(j) * bw + (double(ix) + 0.5) * bw / double(gw), height, width));
    parallelFor(c.pool, channels, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        const T *plane = x.as<T>() + (b * channels + ch) * height * width;
        T *out = o.as<T>() + (n * channels + ch) * ph * pw;
        size_t t = 0;
        for (int64_t bin = 0; bin < ph * pw; ++bin) {
          double acc = 0;
          for (int64_t s = 0; s < gh * gw; ++s, ++t) {
            const Tap &tp = taps[t];
            if (maxMode) {
              double v = std::max({tp.w[0] * double(plane[tp.pos[0]]), tp.w[1] * double(plane[tp.pos[1]]),
                                   tp.w[2] * double(plane[tp.pos[2]]), tp.w[3] * double(plane[tp.pos[3]])});
              acc = s == 0 ? v : std::max(acc, v);
            } else {
              for (int q = 0; q < 4; ++q) acc += tp.w[q] * double(plane[tp.pos[q]]);
            }
          }
          out[bin] = T(maxMode ? acc : acc / count);
        }
      }
    });
  }
  return Status::ok();
}

Status RoiAlignKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) { return roiAlign<decltype(tag)>(c); });
}

} // namespace

void registerRoiAlignKernels() { registerCpuKernel("RoiAlign", RoiAlignKernel, TypeSet::floats()); }

} // namespace sd::cpu
