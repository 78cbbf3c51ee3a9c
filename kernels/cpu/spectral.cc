// CPU kernels of DFT, STFT, the window generators and MelWeightMatrix. The
// DFT is direct (O(n^2) per line, double accumulation, one twiddle table per
// call): speech front ends use lengths of a few hundred.
#include "../shapes/spectral.h"
#include "cpu_util.h"
#include "sd/ops/math/windows.h"
#include <cmath>
#include <complex>
#include <vector>

namespace sd::cpu {
namespace {

using Complex = std::complex<double>;

using spectral::twiddles;

// out[k] = sum_j in[j] w[(j k) mod L] for k < bins (in: L values, zero-padded by the caller).
void transform(const std::vector<Complex> &in, const std::vector<Complex> &w, int64_t bins, std::vector<Complex> &out) {
  int64_t L = int64_t(w.size());
  out.assign(size_t(bins), Complex());
  for (int64_t k = 0; k < bins; ++k) {
    Complex acc;
    for (int64_t j = 0, t = 0; j < L; ++j, t = (t + k) % L) acc += in[size_t(j)] * w[size_t(t)];
    out[size_t(k)] = acc;
  }
}

template <typename T> Status dft(const KernelContext &c) {
  spectral::DftPlan p;
  const TensorView &x = c.inputs[0];
  const TensorView *len = c.hasInput(1) && c.inputs[1].data ? &c.inputs[1] : nullptr;
  const TensorView *axis = c.hasInput(2) && c.inputs[2].data ? &c.inputs[2] : nullptr;
  TensorInfo info{x.dtype, x.dims};
  SD_RETURN_IF_ERROR(spectral::planDft(info, c.attrs, len, axis, p));
  int64_t ch = x.dims.back();
  // The signal dims (all but the trailing real/imaginary one) around the axis.
  auto [outer, n, inner] = extentAround(Dims(x.dims.begin(), x.dims.end() - 1), p.axis);
  const T *in = x.as<T>();
  T *out = c.outputs[0].as<T>();
  int64_t L = p.length, bins = p.outBins, oc = p.outChannels;
  std::vector<Complex> w = twiddles(L, p.inverse ? 1.0 : -1.0), line(static_cast<size_t>(L)), res;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      std::fill(line.begin(), line.end(), Complex());
      auto at = [&](int64_t j) { return ((o * n + j) * inner + i) * ch; };
      if (p.inverse && p.onesided) { // irfft: a Hermitian spectrum from its first L/2 + 1 bins
        int64_t half = L / 2;
        for (int64_t k = 0; k <= half && k < n; ++k) {
          Complex v(double(in[at(k)]), ch == 2 ? double(in[at(k) + 1]) : 0.0);
          if (k == 0 || (L % 2 == 0 && k == half)) v = Complex(v.real(), 0.0);
          line[size_t(k)] = v;
          if (k > 0 && L - k != k) line[size_t(L - k)] = std::conj(v);
        }
      } else {
        for (int64_t j = 0; j < std::min(n, L); ++j)
          line[size_t(j)] = Complex(double(in[at(j)]), ch == 2 ? double(in[at(j) + 1]) : 0.0);
      }
      transform(line, w, bins, res);
      double scale = p.inverse ? 1.0 / double(L) : 1.0;
      for (int64_t k = 0; k < bins; ++k) {
        T *dst = out + ((o * bins + k) * inner + i) * oc;
        dst[0] = T(res[size_t(k)].real() * scale);
        if (oc == 2) dst[1] = T(res[size_t(k)].imag() * scale);
      }
    }
  return Status::ok();
}

template <typename T> Status stft(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  bool hasWindow = c.hasInput(2) && c.inputs[2].data;
  TensorInfo windowInfo{c.hasInput(2) ? c.inputs[2].dtype : DType::Undefined, c.hasInput(2) ? c.inputs[2].dims : Dims{}};
  spectral::StftPlan p;
  SD_RETURN_IF_ERROR(spectral::planStft(TensorInfo{x.dtype, x.dims}, &c.inputs[1], hasWindow ? &windowInfo : nullptr,
                                        c.hasInput(3) && c.inputs[3].data ? &c.inputs[3] : nullptr,
                                        c.attrs.getInt("onesided", 1) != 0, p));
  int64_t batch = x.dims[0], len = x.dims[1], ch = x.dims[2], L = p.frameLength;
  const T *in = x.as<T>(), *win = hasWindow ? c.inputs[2].as<T>() : nullptr;
  T *out = c.outputs[0].as<T>();
  std::vector<Complex> w = twiddles(L, -1.0), frame(static_cast<size_t>(L)), res;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t f = 0; f < p.frames; ++f) {
      std::fill(frame.begin(), frame.end(), Complex());
      for (int64_t j = 0; j < std::min(p.windowLength, L); ++j) {
        int64_t s = f * p.step + j;
        if (s >= len) break;
        double g = win ? double(win[j]) : 1.0;
        const T *v = in + (b * len + s) * ch;
        frame[size_t(j)] = Complex(double(v[0]) * g, ch == 2 ? double(v[1]) * g : 0.0);
      }
      transform(frame, w, p.bins, res);
      for (int64_t k = 0; k < p.bins; ++k) {
        T *dst = out + ((b * p.frames + f) * p.bins + k) * 2;
        dst[0] = T(res[size_t(k)].real()), dst[1] = T(res[size_t(k)].imag());
      }
    }
  return Status::ok();
}

// ONNX's windows: N = size when periodic, size - 1 when symmetric.
template <math::Window Kind> Status window(const KernelContext &c) {
  double size;
  SD_RETURN_IF_ERROR(spectral::scalarValue(&c.inputs[0], "window size", size));
  int64_t n = int64_t(size);
  double N = c.attrs.getInt("periodic", 1) ? double(n) : double(n - 1);
  return dispatchFloat(c.outputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    T *y = c.outputs[0].as<T>();
    for (int64_t i = 0; i < n; ++i) y[i] = T(math::windowValue(Kind, i, N));
    return Status::ok();
  });
}

// Triangular mel filters, as onnx/reference computes them (including its
// (num_mel_bins + 2) mel step and the integer bin positions).
Status MelWeightMatrixKernel(const KernelContext &c) {
  double v[5];
  const char *names[5] = {"num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"};
  for (int i = 0; i < 5; ++i) SD_RETURN_IF_ERROR(spectral::scalarValue(&c.inputs[size_t(i)], names[i], v[i]));
  int64_t mels = int64_t(v[0]), length = int64_t(v[1]), rows = length / 2 + 1;
  SD_CHECK_ARG(v[2] > 0, "MelWeightMatrix sample_rate must be positive");
  auto toMel = [](double hz) { return 2595.0 * std::log1p(hz / 700.0) / std::log(10.0); };
  double low = toMel(v[3]), step = (toMel(v[4]) - low) / double(mels + 2);
  std::vector<int64_t> bin(static_cast<size_t>(mels + 2));
  for (int64_t i = 0; i < mels + 2; ++i) {
    double hz = 700.0 * std::expm1((double(i) * step + low) / 2595.0 * std::log(10.0));
    bin[size_t(i)] = int64_t(std::floor(double(length + 1) * hz / v[2]));
  }
  std::vector<double> out(static_cast<size_t>(rows * mels), 0.0);
  auto set = [&](int64_t r, int64_t m, double x) {
    if (r >= 0 && r < rows) out[size_t(r * mels + m)] = x;
  };
  for (int64_t m = 0; m < mels; ++m) {
    int64_t lo = bin[size_t(m)], mid = bin[size_t(m + 1)], hi = bin[size_t(m + 2)];
    if (mid == lo) set(mid, m, 1.0);
    else
      for (int64_t j = lo; j <= mid; ++j) set(j, m, double(j - lo) / double(mid - lo));
    if (hi > mid)
      for (int64_t j = mid; j < hi; ++j) set(j, m, double(hi - j) / double(hi - mid));
  }
  return dispatchFloat(c.outputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    for (size_t i = 0; i < out.size(); ++i) c.outputs[0].as<T>()[i] = T(out[i]);
    return Status::ok();
  });
}

Status DFTKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) { return dft<decltype(tag)>(c); });
}
Status STFTKernel(const KernelContext &c) {
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) { return stft<decltype(tag)>(c); });
}

} // namespace

void registerSpectralKernels() {
  registerCpuKernel("DFT", DFTKernel, {DType::F32, DType::F64});
  registerCpuKernel("STFT", STFTKernel, {DType::F32, DType::F64});
  registerCpuKernel("HannWindow", window<math::Window::Hann>, {DType::F32, DType::F64}, nullptr, -1);
  registerCpuKernel("HammingWindow", window<math::Window::Hamming>, {DType::F32, DType::F64}, nullptr, -1);
  registerCpuKernel("BlackmanWindow", window<math::Window::Blackman>, {DType::F32, DType::F64}, nullptr, -1);
  registerCpuKernel("MelWeightMatrix", MelWeightMatrixKernel, {DType::F32, DType::F64}, nullptr, -1);
}

} // namespace sd::cpu
