// DeformConv's sampling, shared by the CPU and CUDA kernels (as
// onnx/reference computes it): a kernel tap reads X bilinearly, zeros
// outside the image, at its regular position plus a learned offset.
#pragma once
#include "sd/ops/attrs.h"
#include "sd/format/tensor.h"
#include "sd/ops/math/host_device.h"
#include <cmath>
#include <cstdint>

namespace sd::math {

// X's h x w plane read at (y, x) by bilinear interpolation, in f64.
template <typename T> SD_HD double bilinearZeros(const T *plane, int64_t h, int64_t w, double y, double x) {
  const double fy = std::floor(y), fx = std::floor(x), ly = y - fy, lx = x - fx;
  const int64_t y0 = int64_t(fy), x0 = int64_t(fx);
  double acc = 0;
  for (int dy = 0; dy < 2; ++dy)
    for (int dx = 0; dx < 2; ++dx) {
      const int64_t yy = y0 + dy, xx = x0 + dx;
      if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
      acc += (dy ? ly : 1 - ly) * (dx ? lx : 1 - lx) * double(plane[yy * w + xx]);
    }
  return acc;
}

// The 2-D DeformConv's attributes and sizes.
struct DeformGeometry {
  int64_t batch, inChannels, inH, inW, outChannels, kh, kw, outH, outW, group, offsetGroups;
  int64_t padTop, padLeft, strideH, strideW, dilationH, dilationW;

  // Tap t (of kh * kw) of output pixel p sampled from one input channel's
  // plane: offY/offX/mask point at that tap's [outH * outW] planes of the
  // offset (and mask, or null) operands.
  template <typename T>
  SD_HD double sample(const T *plane, const T *offY, const T *offX, const T *mask, int64_t t, int64_t p) const {
    const int64_t i = t / kw, j = t % kw;
    const double y = double(-padTop + strideH * (p / outW) + i * dilationH) + double(offY[p]);
    const double x = double(-padLeft + strideW * (p % outW) + j * dilationW) + double(offX[p]);
    const double v = bilinearZeros(plane, inH, inW, y, x);
    return mask ? v * double(mask[p]) : v;
  }
};

// The geometry of a DeformConv of x [N, C, H, W] by w [M, C/group, kh, kw] into y.
inline DeformGeometry deformGeometryOf(const AttrMap &attrs, const Dims &x, const Dims &w, const Dims &y) {
  Dims dil = attrs.getInts("dilations"), pads = attrs.getInts("pads"), strides = attrs.getInts("strides");
  if (dil.size() < 2) dil = {1, 1};
  if (pads.size() < 2) pads = {0, 0, 0, 0};
  if (strides.size() < 2) strides = {1, 1};
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], attrs.getInt("group", 1), attrs.getInt("offset_group", 1),
          pads[0], pads[1], strides[0], strides[1], dil[0], dil[1]};
}

} // namespace sd::math
