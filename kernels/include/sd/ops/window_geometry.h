// Sliding-window geometry (pads, strides, dilations, auto_pad, ceil_mode) for
// Conv, ConvTranspose and the pools; shared by shape rules and kernels so both
// agree on every output size.
#pragma once
#include "sd/ops/attrs.h"
#include "sd/format/status.h"
#include "sd/format/tensor.h"

namespace sd {

struct WindowGeometry {
  Dims in, kernel, strides, dilations, padBegin, padEnd, out, outputPadding;
  size_t rank() const { return in.size(); }
};

// Input offset of kernel tap `kk` (flat index into g.kernel) for the output
// position `o`, or -1 when the tap falls into padding.
inline int64_t windowTapOffset(const WindowGeometry &g, const Dims &o, int64_t kk, const Dims &inStrides) {
  int64_t off = 0;
  bool inside = true;
  for (int64_t d = int64_t(g.rank()) - 1; d >= 0; --d) {
    size_t u = size_t(d);
    int64_t k = kk % g.kernel[u];
    kk /= g.kernel[u];
    int64_t pos = o[u] * g.strides[u] - g.padBegin[u] + k * g.dilations[u];
    inside = inside && pos >= 0 && pos < g.in[u];
    off += pos * inStrides[u];
  }
  return inside ? off : -1;
}

// Conv and pools. `inSpatial`/`kernel` are the spatial dims only.
Status resolveWindows(const AttrMap &attrs, const Dims &inSpatial, const Dims &kernel, bool allowCeilMode,
                      WindowGeometry &g);
// ConvTranspose (output_padding, output_shape).
Status resolveTransposedWindows(const AttrMap &attrs, const Dims &inSpatial, const Dims &kernel, WindowGeometry &g);

} // namespace sd
