// RoiAlign (opsets 10 and 16) on CPU, as onnx/reference computes it: each
// output bin of a region averages (or maxes) bilinear samples on a
// sampling_ratio (or adaptive) grid (sd/ops/math/roi_align.h, shared with
// CUDA). A region's samples are computed once for all its channels.
#include "cpu_util.h"
#include "sd/ops/math/roi_align.h"
#include <algorithm>
#include <cmath>
#include <vector>

namespace sd::cpu {
namespace {

template <typename T> Status roiAlign(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &rois = c.inputs[1], &o = c.outputs[0];
  std::vector<int64_t> batchOf;
  SD_CHECK_ARG(readIntegers(c.inputs[2], batchOf), "RoiAlign batch_indices must be integers");
  const math::RoiAttributes attrs = math::roiAttributesOf(c.attrs);
  int64_t channels = x.dims[1], height = x.dims[2], width = x.dims[3], ph = o.dims[2], pw = o.dims[3];
  const T *pr = rois.as<T>();
  for (int64_t n = 0; n < o.dims[0]; ++n) {
    int64_t b = batchOf[size_t(n)];
    SD_CHECK_ARG(b >= 0 && b < x.dims[0], "RoiAlign batch index ", b, " out of range [0, ", x.dims[0], ")");
    const math::RoiRegion r = math::roiRegion(double(pr[n * 4]), double(pr[n * 4 + 1]), double(pr[n * 4 + 2]),
                                              double(pr[n * 4 + 3]), attrs, ph, pw);
    std::vector<math::RoiTap> taps;
    taps.reserve(size_t(ph * pw * r.gridH * r.gridW));
    for (int64_t i = 0; i < ph; ++i)
      for (int64_t j = 0; j < pw; ++j)
        for (int64_t iy = 0; iy < r.gridH; ++iy)
          for (int64_t ix = 0; ix < r.gridW; ++ix) taps.push_back(r.tap(i, j, iy, ix, height, width));
    parallelFor(c.pool, channels, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        const T *plane = x.as<T>() + (b * channels + ch) * height * width;
        T *out = o.as<T>() + (n * channels + ch) * ph * pw;
        size_t t = 0;
        for (int64_t bin = 0; bin < ph * pw; ++bin) {
          double acc = 0;
          for (int64_t s = 0; s < r.gridH * r.gridW; ++s, ++t) acc = math::addRoiSample(acc, s, taps[t], plane, attrs.maxMode);
          out[bin] = T(attrs.maxMode ? acc : acc / r.samples());
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
