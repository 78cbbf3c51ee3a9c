// DeformConv (opset 19) on CPU for 2-D images, as onnx/reference computes it:
// every kernel tap samples X bilinearly (zeros outside) at its regular
// position plus a learned offset, scaled by the optional mask; the sampled
// columns then go through one GEMM per group, as an im2col convolution.
#include "cpu_util.h"
#include "gemm.h"
#include <cmath>
#include <vector>

namespace sd::cpu {
namespace {

template <typename T> double bilinearZeros(const T *plane, int64_t h, int64_t w, double y, double x) {
  double fy = std::floor(y), fx = std::floor(x), ly = y - fy, lx = x - fx, acc = 0;
  int64_t y0 = int64_t(fy), x0 = int64_t(fx);
  for (int dy = 0; dy < 2; ++dy)
    for (int dx = 0; dx < 2; ++dx) {
      int64_t yy = y0 + dy, xx = x0 + dx;
      if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
      acc += (dy ? ly : 1 - ly) * (dx ? lx : 1 - lx) * double(plane[yy * w + xx]);
    }
  return acc;
}

template <typename T> Status deformConv(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &wt = c.inputs[1], &offset = c.inputs[2], &o = c.outputs[0];
  const TensorView *bias = c.hasInput(3) && c.inputs[3].data ? &c.inputs[3] : nullptr;
  const TensorView *mask = c.hasInput(4) && c.inputs[4].data ? &c.inputs[4] : nullptr;
  int64_t n = x.dims[0], ic = x.dims[1], ih = x.dims[2], iw = x.dims[3];
  int64_t oc = wt.dims[0], kh = wt.dims[2], kw = wt.dims[3], oh = o.dims[2], ow = o.dims[3];
  int64_t group = c.attrs.getInt("group", 1), offsetGroups = c.attrs.getInt("offset_group", 1);
  Dims dil = c.attrs.getInts("dilations"), pads = c.attrs.getInts("pads"), strides = c.attrs.getInts("strides");
  if (dil.empty()) dil = {1, 1};
  if (pads.empty()) pads = {0, 0, 0, 0};
  if (strides.empty()) strides = {1, 1};
  int64_t taps = kh * kw, pixels = oh * ow, icg = ic / group, ocg = oc / group, icPerOffset = ic / offsetGroups;
  int64_t kdim = icg * taps;
  std::vector<T> cols(size_t(ic * taps * pixels));
  for (int64_t b = 0; b < n; ++b) {
    parallelFor(c.pool, ic, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        int64_t og = ch / icPerOffset;
        const T *plane = x.as<T>() + (b * ic + ch) * ih * iw;
        for (int64_t t = 0; t < taps; ++t) {
          int64_t i = t / kw, j = t % kw;
          const T *offY = offset.as<T>() + ((b * offsetGroups + og) * taps * 2 + t * 2) * pixels;
          const T *offX = offY + pixels;
          const T *m = mask ? mask->as<T>() + ((b * offsetGroups + og) * taps + t) * pixels : nullptr;
          T *col = cols.data() + (ch * taps + t) * pixels;
          for (int64_t p = 0; p < pixels; ++p) {
            double y = double(-pads[0] + strides[0] * (p / ow) + i * dil[0]) + double(offY[p]);
            double xx = double(-pads[1] + strides[1] * (p % ow) + j * dil[1]) + double(offX[p]);
            double v = bilinearZeros(plane, ih, iw, y, xx);
            col[p] = T(m ? v * double(m[p]) : v);
          }
        }
      }
    });
    for (int64_t g = 0; g < group; ++g) {
      T *out = o.as<T>() + (b * oc + g * ocg) * pixels;
      parallelGemm<T>(c.pool, false, false, ocg, pixels, kdim, T(1), wt.as<T>() + g * ocg * kdim, kdim,
                      cols.data() + g * kdim * pixels, pixels, T(0), out, pixels);
      if (bias)
        for (int64_t q = 0; q < ocg; ++q)
          for (int64_t p = 0; p < pixels; ++p) out[q * pixels + p] += bias->as<T>()[g * ocg + q];
    }
  }
  return Status::ok();
}

Status DeformConvKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) { return deformConv<decltype(tag)>(c); });
}

} // namespace

void registerDeformConvKernels() { registerCpuKernel("DeformConv", DeformConvKernel, TypeSet::floats()); }

} // namespace sd::cpu
