// DeformConv (opset 19) on CPU for 2-D images, as onnx/reference computes it:
// every kernel tap samples X bilinearly (zeros outside) at its regular
// position plus a learned offset, scaled by the optional mask; the sampled
// columns then go through one GEMM per group, as an im2col convolution.
#include "cpu_util.h"
#include "gemm.h"
#include "sd/ops/math/deform_conv.h"
#include <cmath>
#include <vector>

namespace sd::cpu {
namespace {

template <typename T> Status deformConv(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &wt = c.inputs[1], &offset = c.inputs[2], &o = c.outputs[0];
  const TensorView *bias = c.hasInput(3) && c.inputs[3].data ? &c.inputs[3] : nullptr;
  const TensorView *mask = c.hasInput(4) && c.inputs[4].data ? &c.inputs[4] : nullptr;
  const math::DeformGeometry g = math::deformGeometryOf(c.attrs, x.dims, wt.dims, o.dims);
  int64_t n = g.batch, ic = g.inChannels, ih = g.inH, iw = g.inW, oc = g.outChannels, group = g.group;
  int64_t taps = g.kh * g.kw, pixels = g.outH * g.outW, icg = ic / group, ocg = oc / group;
  int64_t offsetGroups = g.offsetGroups, icPerOffset = ic / offsetGroups, kdim = icg * taps;
  std::vector<T> cols(size_t(ic * taps * pixels));
  for (int64_t b = 0; b < n; ++b) {
    parallelFor(c.pool, ic, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        int64_t og = ch / icPerOffset;
        const T *plane = x.as<T>() + (b * ic + ch) * ih * iw;
        for (int64_t t = 0; t < taps; ++t) {
          const T *offY = offset.as<T>() + ((b * offsetGroups + og) * taps * 2 + t * 2) * pixels;
          const T *offX = offY + pixels;
          const T *m = mask ? mask->as<T>() + ((b * offsetGroups + og) * taps + t) * pixels : nullptr;
          T *col = cols.data() + (ch * taps + t) * pixels;
          for (int64_t p = 0; p < pixels; ++p) col[p] = T(g.sample(plane, offY, offX, m, t, p));
        }
      }
    });
    for (int64_t gi = 0; gi < group; ++gi) {
      T *out = o.as<T>() + (b * oc + gi * ocg) * pixels;
      parallelGemm<T>(c.pool, false, false, ocg, pixels, kdim, T(1), wt.as<T>() + gi * ocg * kdim, kdim,
                      cols.data() + gi * kdim * pixels, pixels, T(0), out, pixels);
      if (bias)
        for (int64_t q = 0; q < ocg; ++q)
          for (int64_t p = 0; p < pixels; ++p) out[q * pixels + p] += bias->as<T>()[gi * ocg + q];
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
