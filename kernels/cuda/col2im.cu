// CUDA kernel of Col2Im (opset 18; see kernels/cpu/col2im.cc), the adjoint of
// im2col, as a gather: each image pixel sums, taps in increasing order, the
// column entry of the one block (if any) whose tap lands on it
// (FlatWindow::reachedBy, the CPU-tested walk). That is the order the CPU
// adds them in, with no atomics. Up to 3 spatial dims; block_shape must be a
// constant, read when the session is created.
#include "cuda_util.cuh"
#include "sd/ops/flat_window.h"
#include <memory>
#include <string>

namespace sd::cuda {
namespace {

template <typename T> __global__ void col2imKernel(FlatWindow w, int64_t planes, const T *cols, T *image) {
  using C = Compute<T>;
  const int64_t total = planes * w.inTotal;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = i / w.inTotal, pixel = i % w.inTotal;
    C acc = C(0);
    for (int64_t kk = 0; kk < w.kernelTotal; ++kk) {
      const int64_t block = w.reachedBy(pixel, kk);
      if (block >= 0) acc += load(cols[(plane * w.kernelTotal + kk) * w.outTotal + block]);
    }
    image[i] = store<T>(acc);
  }
}

struct Col2ImPrepared {
  FlatWindow window;
  std::string error;
};

std::shared_ptr<const void> prepareCol2Im(const PrepareContext &p) {
  auto s = std::make_shared<Col2ImPrepared>();
  const KernelContext &c = p.kernel;
  std::vector<int64_t> block;
  if (!hostIntegers(p, 2, block)) {
    s->error = "Col2Im on CUDA needs a constant block_shape";
    return s;
  }
  const TensorView &o = c.outputs[0];
  const size_t k = block.size();
  if (k < 1 || k > size_t(kMaxFlatWindowRank) || o.rank() != int64_t(k) + 2) {
    s->error = "Col2Im on CUDA takes images of 1 to 3 spatial dims";
    return s;
  }
  Dims dil = c.attrs.getInts("dilations"), pads = c.attrs.getInts("pads"), strides = c.attrs.getInts("strides");
  if (dil.empty()) dil.assign(k, 1);
  if (strides.empty()) strides.assign(k, 1);
  if (pads.empty()) pads.assign(2 * k, 0);
  FlatWindow &w = s->window;
  w.rank = int(k);
  for (size_t d = 0; d < k; ++d) {
    w.in[d] = o.dims[d + 2];
    w.kernel[d] = block[d];
    w.strides[d] = strides[d];
    w.dilations[d] = dil[d];
    w.padBegin[d] = pads[d];
    w.padEnd[d] = pads[d + k];
    w.out[d] = (w.in[d] + pads[d] + pads[d + k] - dil[d] * (block[d] - 1) - 1) / strides[d] + 1;
    w.inTotal *= w.in[d];
    w.outTotal *= w.out[d];
    w.kernelTotal *= w.kernel[d];
  }
  const TensorView &x = c.inputs[0];
  if (x.dims[0] * x.dims[1] != o.dims[0] * o.dims[1] * w.kernelTotal || x.dims[2] != w.outTotal)
    s->error = "Col2Im input " + formatDims(x.dims) + " does not hold " + std::to_string(w.kernelTotal) + " taps x " +
               std::to_string(w.outTotal) + " blocks per channel";
  return s;
}

Status Col2ImKernel(const KernelContext &c) {
  auto *s = static_cast<const Col2ImPrepared *>(c.prepared);
  if (!s) return sdError("Col2Im was not prepared");
  if (!s->error.empty()) return sdError(s->error);
  const TensorView &o = c.outputs[0];
  const int64_t planes = o.dims[0] * o.dims[1];
  if (o.numElements() == 0) return Status::ok();
  return dispatchFloatStorage(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    col2imKernel<T><<<blocksFor(o.numElements()), kThreads, 0, streamOf(c)>>>(s->window, planes, c.inputs[0].as<T>(),
                                                                               o.as<T>());
    return launchStatus("Col2Im");
  });
}

} // namespace

void registerCol2ImKernels() { registerKernel("Col2Im", Col2ImKernel, TypeSet::floats(), prepareCol2Im); }

} // namespace sd::cuda
