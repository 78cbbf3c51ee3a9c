// A forward convolution's channel split, shared by the float (conv.cu) and
// integer (integer_products.cu) convolutions.
#pragma once
#include "cuda_util.cuh"

namespace sd::cuda {

struct ConvShape {
  int64_t n = 0, cin = 0, m = 0, group = 1, cg = 0, mg = 0;
};

// A forward convolution's channels: x [n, cin, ...] to m output channels in `group` groups.
inline StatusOr<ConvShape> convShapeOf(const KernelContext &c, const TensorView &x, int64_t m, const char *op) {
  ConvShape s;
  s.n = x.dims[0];
  s.cin = x.dims[1];
  s.m = m;
  s.group = c.attrs.getInt("group", 1);
  if (s.group <= 0 || s.cin % s.group || s.m % s.group) return sdError(op, " group does not divide the channels");
  s.cg = s.cin / s.group;
  s.mg = s.m / s.group;
  return s;
}

} // namespace sd::cuda
