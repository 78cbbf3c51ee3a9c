// CUDA kernel of the 2-D DeformConv (opset 19; see kernels/cpu/deform_conv.cc):
// one thread per output element sums, over its group's input channels and
// the kernel taps, the weight times the tap's bilinear sample at its offset
// position (the CPU's shared sampling, sd/ops/math/deform_conv.h, rounded to
// the element type as the CPU's im2col columns are), then adds the bias. A
// direct loop, not a GEMM: these layers are few in the detectors that use them.
#include "cuda_util.cuh"
#include "sd/ops/math/deform_conv.h"

namespace sd::cuda {
namespace {

template <typename T>
__global__ void deformConvKernel(math::DeformGeometry g, const T *x, const T *w, const T *offset, const T *bias,
                                 const T *mask, T *y, int64_t total) {
  using C = Compute<T>;
  const int64_t taps = g.kh * g.kw, pixels = g.outH * g.outW, icg = g.inChannels / g.group;
  const int64_t ocg = g.outChannels / g.group, icPerOffset = g.inChannels / g.offsetGroups;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = e % pixels, oc = (e / pixels) % g.outChannels, b = e / (pixels * g.outChannels);
    const int64_t grp = oc / ocg;
    C acc = 0;
    for (int64_t ci = 0; ci < icg; ++ci) {
      const int64_t ch = grp * icg + ci, og = ch / icPerOffset;
      const T *plane = x + (b * g.inChannels + ch) * g.inH * g.inW;
      for (int64_t t = 0; t < taps; ++t) {
        const T *offY = offset + ((b * g.offsetGroups + og) * taps * 2 + t * 2) * pixels;
        const T *m = mask ? mask + ((b * g.offsetGroups + og) * taps + t) * pixels : nullptr;
        const T column = T(g.sample(plane, offY, offY + pixels, m, t, p));
        acc += C(w[(oc * icg + ci) * taps + t]) * C(column);
      }
    }
    if (bias) acc += C(bias[oc]);
    y[e] = T(acc);
  }
}

Status DeformConvKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &wt = c.inputs[1], &offset = c.inputs[2], &o = c.outputs[0];
  if (x.rank() != 4 || wt.rank() != 4 || o.rank() != 4) return sdError("DeformConv on CUDA takes 2-D images");
  const math::DeformGeometry g = math::deformGeometryOf(c.attrs, x.dims, wt.dims, o.dims);
  if (g.group <= 0 || g.offsetGroups <= 0 || g.inChannels % g.group || g.outChannels % g.group ||
      g.inChannels % g.offsetGroups || wt.dims[1] != g.inChannels / g.group)
    return sdError("DeformConv: group ", g.group, " and offset_group ", g.offsetGroups, " do not divide the channels");
  const TensorView *bias = c.hasInput(3) && c.inputs[3].data ? &c.inputs[3] : nullptr;
  const TensorView *mask = c.hasInput(4) && c.inputs[4].data ? &c.inputs[4] : nullptr;
  const int64_t total = o.numElements();
  if (total == 0) return Status::ok();
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    deformConvKernel<T><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(
        g, x.as<T>(), wt.as<T>(), offset.as<T>(), bias ? bias->as<T>() : nullptr, mask ? mask->as<T>() : nullptr,
        o.as<T>(), total);
    return launchStatus("DeformConv");
  };
  if (x.dtype == DType::F64) return launch(double{});
  if (x.dtype == DType::F32) return launch(float{});
  return sdError("DeformConv on CUDA computes f32 and f64");
}

} // namespace

void registerDeformConvKernels() { registerKernel("DeformConv", DeformConvKernel, TypeSet::floats()); }

} // namespace sd::cuda
