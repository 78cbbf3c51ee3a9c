// Geometry of the spectral ops (DFT, STFT, windows, mel filter bank), shared by
// their shape rules and CPU and CUDA kernels so all size results the same way.
#pragma once
#include "sd/format/status.h"
#include "sd/ops/attrs.h"
#include "sd/format/tensor.h"
#include <complex>
#include <vector>

namespace sd::spectral {

// DFT over `axis` of x [..., n, ..., c] (c = 1 real, 2 complex; axis is not the last dim).
struct DftPlan {
  int64_t axis = 0;      // non-negative
  int64_t length = 0;    // transform length
  int64_t outBins = 0;   // bins (or samples, for an inverse one-sided DFT) written along axis
  int64_t outChannels = 2;
  bool inverse = false, onesided = false;
};
// `dftLength`/`axisValue`: the optional operands' values (null: absent).
Status planDft(const TensorInfo &x, const AttrMap &attrs, const TensorView *dftLength, const TensorView *axisValue,
               DftPlan &plan);

struct StftPlan {
  int64_t step = 0, frameLength = 0, windowLength = 0, frames = 0, bins = 0;
};
Status planStft(const TensorInfo &signal, const TensorView *frameStep, const TensorInfo *window,
                const TensorView *frameLength, bool onesided, StftPlan &plan);

// e^{sign 2 pi i t / L} for t in [0, L): the DFT's twiddle table, the CPU
// kernels' and (uploaded) the CUDA kernels'.
std::vector<std::complex<double>> twiddles(int64_t length, double sign);

// Reads a one-element integer or float operand.
Status scalarValue(const TensorView *t, const char *what, double &out);

} // namespace sd::spectral
