// Resize's interpolation taps per axis (input index and weight of each tap
// of each output position), from its attributes and its roi/scales values:
// nearest, (multi)linear and cubic, antialiased or not, with every ONNX
// coordinate transformation mode. Shared by the CPU and CUDA kernels (the
// CUDA kernel resolves them when the session is created and uploads them).
#pragma once
#include "sd/ops/attrs.h"
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include <cstdint>
#include <vector>

namespace sd {

struct ResizeAxisTaps {
  int taps = 1;
  std::vector<int64_t> index;   // [out * taps]
  std::vector<double> weight;   // [out * taps]
  std::vector<uint8_t> outside; // tf_crop_and_resize: extrapolate this output position
};

// Every axis's taps for resizing `in` to `out`. `roi` and `scales` are the
// operands' values (empty when absent); `scales` given means each axis's
// scale is its entry, else out / in.
Status resizeTaps(const AttrMap &attrs, const Dims &in, const Dims &out, const std::vector<double> &roi,
                  const std::vector<double> &scales, std::vector<ResizeAxisTaps> &taps);

// The adjoint of one axis's taps, for Resize's gradient: for input position
// i, the output positions that read it and with what weight, in output
// order (entries [start[i], start[i + 1]) of `from` and `weight`). An
// extrapolated output position reads nothing. `identity`: every output reads
// the input at its own position with weight 1 (the axis is not resized).
struct ResizeAxisAdjoint {
  std::vector<int64_t> start, from;
  std::vector<double> weight;
  bool identity = false;
};
ResizeAxisAdjoint resizeAdjoint(const ResizeAxisTaps &taps, int64_t in, int64_t out);

} // namespace sd
