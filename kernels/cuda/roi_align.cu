// CUDA kernel of RoiAlign (see kernels/cpu/roi_align.cc): one thread per
// output bin of a channel, sampling it with the CPU's shared math
// (sd/ops/math/roi_align.h) in the CPU's order, in f64. A GPU cannot stop
// mid-step to refuse a batch index out of range, as the CPU does: that
// region's bins are NaN.
#include "cuda_util.cuh"
#include "sd/ops/math/roi_align.h"
#include <cmath>

namespace sd::cuda {
namespace {

struct RoiGeometry {
  int64_t batch, channels, height, width, ph, pw;
  math::RoiAttributes attrs;
};

template <typename T, typename I>
__global__ void roiAlignKernel(RoiGeometry g, const T *x, const T *rois, const I *batchOf, T *out, int64_t n) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bin = o % (g.ph * g.pw), i = bin / g.pw, j = bin % g.pw;
    const int64_t ch = (o / (g.ph * g.pw)) % g.channels, roi = o / (g.ph * g.pw * g.channels);
    const int64_t b = int64_t(batchOf[roi]);
    if (b < 0 || b >= g.batch) {
      out[o] = T(NAN);
      continue;
    }
    const T *box = rois + roi * 4;
    const math::RoiRegion r =
        math::roiRegion(double(box[0]), double(box[1]), double(box[2]), double(box[3]), g.attrs, g.ph, g.pw);
    const T *plane = x + (b * g.channels + ch) * g.height * g.width;
    double acc = 0;
    for (int64_t iy = 0, s = 0; iy < r.gridH; ++iy)
      for (int64_t ix = 0; ix < r.gridW; ++ix, ++s)
        acc = math::addRoiSample(acc, s, r.tap(i, j, iy, ix, g.height, g.width), plane, g.attrs.maxMode);
    out[o] = T(g.attrs.maxMode ? acc : acc / r.samples());
  }
}

Status RoiAlignKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &rois = c.inputs[1], &batchOf = c.inputs[2], &o = c.outputs[0];
  if (x.rank() != 4 || o.rank() != 4 || rois.dtype != x.dtype)
    return sdError("RoiAlign on CUDA takes a 4-D X and regions of X's type");
  const RoiGeometry g{x.dims[0], x.dims[1], x.dims[2], x.dims[3], o.dims[2], o.dims[3], math::roiAttributesOf(c.attrs)};
  const int64_t n = o.numElements();
  if (n == 0) return Status::ok();
  return dispatchIndex(batchOf.dtype, [&](auto itag) {
    using I = decltype(itag);
    if (x.dtype == DType::F64) {
      roiAlignKernel<double, I><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(g, x.as<double>(), rois.as<double>(),
                                                                            batchOf.as<I>(), o.as<double>(), n);
    } else {
      roiAlignKernel<float, I><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(g, x.as<float>(), rois.as<float>(),
                                                                           batchOf.as<I>(), o.as<float>(), n);
    }
    return launchStatus("RoiAlign");
  });
}

} // namespace

void registerRoiAlignKernels() { registerKernel("RoiAlign", RoiAlignKernel, {DType::F32, DType::F64}); }

} // namespace sd::cuda
