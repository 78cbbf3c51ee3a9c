// Col2Im (opset 18): the adjoint of im2col. Column (c, kernel tap) of block b
// adds into the image at b * stride - pad_begin + tap * dilation, any number
// of spatial dims; taps that land in the padding are dropped.
#include "cpu_util.h"
#include <vector>

namespace sd::cpu {
namespace {

template <typename T> Status col2im(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  std::vector<int64_t> block;
  SD_CHECK_ARG(readIntegers(c.inputs[2], block), "Col2Im block_shape must be integers");
  size_t k = block.size();
  Dims image(o.dims.begin() + 2, o.dims.end()), dil = c.attrs.getInts("dilations"), pads = c.attrs.getInts("pads"),
      strides = c.attrs.getInts("strides");
  if (dil.empty()) dil.assign(k, 1);
  if (strides.empty()) strides.assign(k, 1);
  if (pads.empty()) pads.assign(2 * k, 0);
  Dims blocks(k);
  for (size_t d = 0; d < k; ++d)
    blocks[d] = (image[d] + pads[d] + pads[d + k] - dil[d] * (block[d] - 1) - 1) / strides[d] + 1;
  int64_t taps = product(Dims(block.begin(), block.end())), nBlocks = product(blocks), pixels = product(image);
  int64_t planes = o.dims[0] * o.dims[1];
  SD_CHECK_ARG(x.dims[1] * x.dims[0] == planes * taps && x.dims[2] == nBlocks, "Col2Im input ", formatDims(x.dims),
               " does not hold ", taps, " taps x ", nBlocks, " blocks per channel");
  Dims imgStr = stridesOf(image);
  parallelFor(c.pool, planes, 1, [&](int64_t lo, int64_t hi) {
    Dims tap(k), pos(k);
    for (int64_t p = lo; p < hi; ++p) {
      T *img = o.as<T>() + p * pixels;
      std::fill(img, img + pixels, T(0));
      for (int64_t t = 0; t < taps; ++t) {
        for (int64_t d = int64_t(k) - 1, r = t; d >= 0; --d) { tap[size_t(d)] = r % block[size_t(d)]; r /= block[size_t(d)]; }
        const T *col = x.as<T>() + (p * taps + t) * nBlocks;
        for (int64_t b = 0; b < nBlocks; ++b) {
          int64_t off = 0;
          bool inside = true;
          for (int64_t d = int64_t(k) - 1, r = b; d >= 0 && inside; --d) {
            size_t u = size_t(d);
            int64_t at = (r % blocks[u]) * strides[u] - pads[u] + tap[u] * dil[u];
            r /= blocks[u];
            inside = at >= 0 && at < image[u];
            off += at * imgStr[u];
          }
          if (inside) img[off] += col[b];
        }
      }
    }
  });
  return Status::ok();
}

Status Col2ImKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) { return col2im<decltype(tag)>(c); });
}

} // namespace

void registerCol2ImKernels() { registerCpuKernel("Col2Im", Col2ImKernel, TypeSet::floats()); }

} // namespace sd::cpu
