// Window geometry resolution, following the ONNX operator definitions.
#include "sd/ops/window_geometry.h"
#include <algorithm>

namespace sd {
namespace {

Status listOr(const AttrMap &a, const char *name, size_t n, int64_t def, Dims &out) {
  out = a.getInts(name);
  if (out.empty()) out.assign(n, def);
  if (out.size() != n) return sdError(name, " has ", out.size(), " entries for ", n, " spatial dims");
  return Status::ok();
}

Status common(const AttrMap &attrs, const Dims &in, const Dims &kernel, WindowGeometry &g) {
  // (Transposed convs may later turn pads negative: extra output past the input.)
  size_t n = in.size();
  if (kernel.size() != n) return sdError("kernel has ", kernel.size(), " dims, input has ", n, " spatial dims");
  g.in = in;
  g.kernel = kernel;
  SD_RETURN_IF_ERROR(listOr(attrs, "strides", n, 1, g.strides));
  SD_RETURN_IF_ERROR(listOr(attrs, "dilations", n, 1, g.dilations));
  Dims pads = attrs.getInts("pads");
  if (pads.empty()) pads.assign(2 * n, 0);
  if (pads.size() != 2 * n) return sdError("pads has ", pads.size(), " entries for ", n, " spatial dims");
  g.padBegin.assign(pads.begin(), pads.begin() + long(n));
  g.padEnd.assign(pads.begin() + long(n), pads.end());
  for (size_t i = 0; i < n; ++i) {
    if (g.strides[i] < 1 || g.dilations[i] < 1) return sdError("strides and dilations must be >= 1");
    if (kernel[i] < 1) return sdError("kernel dim ", i, " is ", kernel[i]);
    if (g.padBegin[i] < 0 || g.padEnd[i] < 0) return sdError("pads must be >= 0");
    if (in[i] < 0) return sdError("spatial dims must be known");
  }
  return Status::ok();
}

} // namespace

Status resolveWindows(const AttrMap &attrs, const Dims &in, const Dims &kernel, bool allowCeil, WindowGeometry &g) {
  SD_RETURN_IF_ERROR(common(attrs, in, kernel, g));
  std::string autoPad = attrs.getString("auto_pad", "NOTSET");
  bool ceil = allowCeil && attrs.getInt("ceil_mode", 0);
  size_t n = in.size();
  g.out.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    int64_t ext = (kernel[i] - 1) * g.dilations[i] + 1;
    if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
      int64_t out = (in[i] + g.strides[i] - 1) / g.strides[i];
      int64_t total = std::max<int64_t>(0, (out - 1) * g.strides[i] + ext - in[i]);
      int64_t small = total / 2, large = total - small;
      g.padBegin[i] = autoPad == "SAME_UPPER" ? small : large;
      g.padEnd[i] = autoPad == "SAME_UPPER" ? large : small;
      g.out[i] = out;
      continue;
    }
    if (autoPad == "VALID") g.padBegin[i] = g.padEnd[i] = 0;
    else if (autoPad != "NOTSET") return sdError("unknown auto_pad '", autoPad, "'");
    int64_t span = in[i] + g.padBegin[i] + g.padEnd[i] - ext;
    if (span < 0) return sdError("window of extent ", ext, " exceeds padded input ", in[i] + g.padBegin[i] + g.padEnd[i]);
    int64_t out = (ceil ? (span + g.strides[i] - 1) / g.strides[i] : span / g.strides[i]) + 1;
    // With ceil_mode the last window must start inside the input or its left padding.
    if (ceil && (out - 1) * g.strides[i] >= in[i] + g.padBegin[i]) --out;
    g.out[i] = out;
  }
  return Status::ok();
}

Status resolveTransposedWindows(const AttrMap &attrs, const Dims &in, const Dims &kernel, WindowGeometry &g) {
  SD_RETURN_IF_ERROR(common(attrs, in, kernel, g));
  size_t n = in.size();
  SD_RETURN_IF_ERROR(listOr(attrs, "output_padding", n, 0, g.outputPadding));
  Dims outShape = attrs.getInts("output_shape");
  if (!outShape.empty() && outShape.size() > n) outShape.erase(outShape.begin(), outShape.end() - long(n));
  std::string autoPad = attrs.getString("auto_pad", "NOTSET");
  g.out.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    int64_t ext = (kernel[i] - 1) * g.dilations[i] + 1;
    int64_t full = g.strides[i] * (in[i] - 1) + g.outputPadding[i] + ext;
    int64_t target = -1;
    if (!outShape.empty()) target = outShape[i];
    else if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") target = in[i] * g.strides[i];
    if (target >= 0) {
      // A negative total pads the output past what the input reaches (zeros +
      // bias there); halves round toward minus infinity as in ONNX's reference.
      int64_t total = full - target;
      if (target < 0 || total < -full) return sdError("output_shape ", target, " is invalid");
      int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      if (autoPad == "SAME_UPPER") {
        g.padBegin[i] = half;
        g.padEnd[i] = total - half;
      } else {
        g.padBegin[i] = total - half;
        g.padEnd[i] = half;
      }
      g.out[i] = target;
    } else {
      if (autoPad == "VALID") g.padBegin[i] = g.padEnd[i] = 0;
      g.out[i] = full - g.padBegin[i] - g.padEnd[i];
      if (g.out[i] < 0) return sdError("pads exceed the transposed conv output");
    }
  }
  return Status::ok();
}

} // namespace sd
