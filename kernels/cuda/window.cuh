// Sliding-window geometry (sd/ops/window_geometry.h) passed by value to the
// conv and pool kernels: up to 3 spatial dims.
#pragma once
#include "cuda_util.cuh"
#include "sd/ops/window_geometry.h"

namespace sd::cuda {

constexpr int kMaxSpatial = 3;

struct Window {
  int rank = 0;
  int64_t in[kMaxSpatial] = {}, out[kMaxSpatial] = {}, kernel[kMaxSpatial] = {}, strides[kMaxSpatial] = {},
          dilations[kMaxSpatial] = {}, padBegin[kMaxSpatial] = {}, padEnd[kMaxSpatial] = {};
  int64_t inTotal = 1, outTotal = 1, kernelTotal = 1;

  // Input offset (within one plane) of tap kk for output position oo, or -1 in padding.
  __device__ int64_t tap(int64_t oo, int64_t kk) const {
    int64_t off = 0, inStride = 1;
    bool inside = true;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t o = oo % out[d], k = kk % kernel[d];
      oo /= out[d];
      kk /= kernel[d];
      int64_t pos = o * strides[d] - padBegin[d] + k * dilations[d];
      inside = inside && pos >= 0 && pos < in[d];
      off += pos * inStride;
      inStride *= in[d];
    }
    return inside ? off : -1;
  }
};

inline StatusOr<Window> windowOf(const WindowGeometry &g) {
  if (g.rank() > size_t(kMaxSpatial)) return sdError("the CUDA backend takes windows of up to 3 spatial dims");
  Window w;
  w.rank = int(g.rank());
  for (int d = 0; d < w.rank; ++d) {
    size_t u = size_t(d);
    w.in[d] = g.in[u];
    w.out[d] = g.out[u];
    w.kernel[d] = g.kernel[u];
    w.strides[d] = g.strides[u];
    w.dilations[d] = g.dilations[u];
    w.padBegin[d] = g.padBegin[u];
    w.padEnd[d] = g.padEnd[u];
    w.inTotal *= g.in[u];
    w.outTotal *= g.out[u];
    w.kernelTotal *= g.kernel[u];
  }
  return w;
}

} // namespace sd::cuda
