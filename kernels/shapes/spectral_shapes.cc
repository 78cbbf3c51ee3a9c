// Shape rules of DFT, STFT, the window generators and MelWeightMatrix (ONNX
// opsets 17 and 20, following onnx/reference).
#include "spectral.h"
#include "shape_util.h"
#include <cmath>

namespace sd {
namespace spectral {

Status scalarValue(const TensorView *t, const char *what, double &out) {
  SD_CHECK_ARG(t != nullptr, what, " must be a constant (or --bind)");
  std::vector<double> v;
  SD_CHECK_ARG(readDoubles(*t, v) && v.size() == 1, what, " must hold one number");
  out = v[0];
  return Status::ok();
}

std::vector<std::complex<double>> twiddles(int64_t length, double sign) {
  std::vector<std::complex<double>> w(static_cast<size_t>(length));
  for (int64_t t = 0; t < length; ++t) {
    double a = sign * 2.0 * 3.14159265358979323846 * double(t) / double(length);
    w[size_t(t)] = std::complex<double>(std::cos(a), std::sin(a));
  }
  return w;
}

Status planDft(const TensorInfo &x, const AttrMap &attrs, const TensorView *dftLength, const TensorView *axisValue,
               DftPlan &plan) {
  int64_t rank = x.rank();
  SD_CHECK_ARG(rank >= 2 && (x.dims.back() == 1 || x.dims.back() == 2), "DFT input must end in a dim of 1 (real) or ",
               "2 (complex), got ", formatDims(x.dims));
  double axis = double(attrs.getInt("axis", 1));
  if (axisValue) SD_RETURN_IF_ERROR(scalarValue(axisValue, "DFT axis", axis));
  plan.axis = int64_t(axis) < 0 ? int64_t(axis) + rank : int64_t(axis);
  SD_CHECK_ARG(plan.axis >= 0 && plan.axis < rank - 1, "DFT axis ", int64_t(axis), " must name a signal dim of ",
               formatDims(x.dims));
  plan.inverse = attrs.getInt("inverse", 0) != 0;
  plan.onesided = attrs.getInt("onesided", 0) != 0;
  int64_t n = x.dims[size_t(plan.axis)];
  plan.length = plan.inverse && plan.onesided ? 2 * (n - 1) : n;
  if (dftLength) {
    double l;
    SD_RETURN_IF_ERROR(scalarValue(dftLength, "DFT dft_length", l));
    plan.length = int64_t(l);
  }
  SD_CHECK_ARG(plan.length >= 1, "DFT length must be positive, got ", plan.length);
  SD_CHECK_ARG(!(plan.onesided && !plan.inverse && x.dims.back() == 2), "a one-sided DFT takes a real input");
  plan.outChannels = plan.inverse && plan.onesided ? 1 : 2;
  plan.outBins = plan.onesided && !plan.inverse ? plan.length / 2 + 1 : plan.length;
  return Status::ok();
}

Status planStft(const TensorInfo &signal, const TensorView *frameStep, const TensorInfo *window,
                const TensorView *frameLength, bool onesided, StftPlan &plan) {
  SD_CHECK_ARG(signal.rank() == 3 && (signal.dims[2] == 1 || signal.dims[2] == 2),
               "STFT signal must be [batch, length, 1 or 2], got ", formatDims(signal.dims));
  double step;
  SD_RETURN_IF_ERROR(scalarValue(frameStep, "STFT frame_step", step));
  plan.step = int64_t(step);
  SD_CHECK_ARG(plan.step >= 1, "STFT frame_step must be positive");
  if (window) {
    SD_CHECK_ARG(window->rank() == 1, "STFT window must be 1-D, got ", formatDims(window->dims));
    plan.windowLength = window->dims[0];
  }
  if (frameLength) {
    double l;
    SD_RETURN_IF_ERROR(scalarValue(frameLength, "STFT frame_length", l));
    plan.frameLength = int64_t(l);
  } else {
    plan.frameLength = window ? plan.windowLength : signal.dims[1];
  }
  if (!window) plan.windowLength = plan.frameLength;
  SD_CHECK_ARG(plan.frameLength >= 1 && plan.frameLength <= signal.dims[1], "STFT frame_length ", plan.frameLength,
               " must be in [1, ", signal.dims[1], "]");
  SD_CHECK_ARG(!(onesided && signal.dims[2] == 2), "a one-sided STFT takes a real signal");
  plan.frames = 1 + (signal.dims[1] - plan.frameLength) / plan.step;
  plan.bins = onesided ? plan.frameLength / 2 + 1 : plan.frameLength;
  return Status::ok();
}

} // namespace spectral

namespace {

Status dftShape(ShapeContext &c) {
  spectral::DftPlan p;
  SD_CHECK_ARG(!c.hasInput(1) || c.constInput(1), "DFT dft_length must be a constant (or --bind)");
  SD_CHECK_ARG(!c.hasInput(2) || c.constInput(2), "DFT axis must be a constant");
  SD_RETURN_IF_ERROR(spectral::planDft(c.inputs[0], c.attrs, c.constInput(1), c.constInput(2), p));
  TensorInfo out = c.inputs[0];
  out.dims[size_t(p.axis)] = p.outBins;
  out.dims.back() = p.outChannels;
  c.outputs = {out};
  return Status::ok();
}

Status stftShape(ShapeContext &c) {
  spectral::StftPlan p;
  SD_RETURN_IF_ERROR(spectral::planStft(c.inputs[0], c.constInput(1), c.hasInput(2) ? &c.inputs[2] : nullptr,
                                        c.hasInput(3) ? c.constInput(3) : nullptr, c.attrs.getInt("onesided", 1) != 0,
                                        p));
  SD_CHECK_ARG(!c.hasInput(3) || c.constInput(3), "STFT frame_length must be a constant (or --bind)");
  c.outputs = {TensorInfo{c.inputs[0].dtype, {c.inputs[0].dims[0], p.frames, p.bins, 2}}};
  return Status::ok();
}

Status windowShape(ShapeContext &c) {
  double size;
  SD_RETURN_IF_ERROR(spectral::scalarValue(c.constInput(0), "window size", size));
  SD_CHECK_ARG(size >= 0 && size <= double(int64_t(1) << 31), "window size ", size, " is out of range");
  int64_t to = c.attrs.getInt("output_datatype", int64_t(DType::F32));
  SD_CHECK_ARG(dtypeIsKnown(int32_t(to)), "window output_datatype ", to, " is not supported");
  c.outputs = {TensorInfo{DType(to), {int64_t(size)}}};
  return Status::ok();
}

Status melShape(ShapeContext &c) {
  double bins, length;
  SD_RETURN_IF_ERROR(spectral::scalarValue(c.constInput(0), "MelWeightMatrix num_mel_bins", bins));
  SD_RETURN_IF_ERROR(spectral::scalarValue(c.constInput(1), "MelWeightMatrix dft_length", length));
  SD_CHECK_ARG(bins >= 1 && length >= 1 && bins * length < double(int64_t(1) << 32),
               "MelWeightMatrix sizes out of range");
  for (size_t i = 2; i < 5; ++i) SD_CHECK_ARG(c.constInput(i), "MelWeightMatrix operand ", i, " must be a constant");
  int64_t to = c.attrs.getInt("output_datatype", int64_t(DType::F32));
  SD_CHECK_ARG(dtypeIsKnown(int32_t(to)), "MelWeightMatrix output_datatype ", to, " is not supported");
  c.outputs = {TensorInfo{DType(to), {int64_t(length) / 2 + 1, int64_t(bins)}}};
  return Status::ok();
}

} // namespace

void registerSpectralShapes() {
  registerShapeRule("DFT", dftShape);
  registerShapeRule("STFT", stftShape);
  for (const char *op : {"HannWindow", "HammingWindow", "BlackmanWindow"}) registerShapeRule(op, windowShape);
  registerShapeRule("MelWeightMatrix", melShape);
}

} // namespace sd
