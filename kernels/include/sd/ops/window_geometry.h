// Sliding-window geometry (pads, strides, dilations, auto_pad, ceil_mode) for
// Conv, ConvTranspose and the pools; shared by shape rules and kernels so both
// agree on every output size.
#pragma once
#include "sd/ops/attrs.h"
#include "sd/ops/status.h"
#include "sd/ops/tensor.h"

namespace sd {

struct WindowGeometry {
  Dims in, kernel, strides, dilations, padBegin, padEnd, out, outputPadding;
  size_t rank() const { return in.size(); }
};

// Conv and pools. `inSpatial`/`kernel` are the spatial dims only.
Status resolveWindows(const AttrMap &attrs, const Dims &inSpatial, const Dims &kernel, bool allowCeilMode,
                      WindowGeometry &g);
// ConvTranspose (output_padding, output_shape).
Status resolveTransposedWindows(const AttrMap &attrs, const Dims &inSpatial, const Dims &kernel, WindowGeometry &g);

} // namespace sd
