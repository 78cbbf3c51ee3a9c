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

} // namespace sd
