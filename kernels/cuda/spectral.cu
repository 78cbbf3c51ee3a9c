// CUDA kernels of DFT and STFT (see kernels/cpu/spectral.cc): the direct
// transform, one thread per output bin of a line (or frame), summing in the
// CPU's order in f64 with the CPU's twiddle table, computed on the host and
// uploaded when the session is created. The plan (axis, length, frame step)
// comes from constant operands read then, with the shape rules' own
// functions (shapes/spectral.h). O(n^2) per line, as on the CPU: speech front
// ends use lengths of a few hundred.
#include "../shapes/spectral.h"
#include "cuda_util.cuh"
#include "sd/ops/index_geometry.h"
#include <cmath>
#include <memory>
#include <string>

namespace sd::cuda {
namespace {

struct SpectralPrepared {
  spectral::DftPlan dft;
  spectral::StftPlan stft;
  double2 *twiddles = nullptr; // e^{sign 2 pi i t / L}, t < L
  std::string error;
  ~SpectralPrepared() { cudaFree(twiddles); }
};

// The CPU's twiddle table (shapes/spectral.h), uploaded; false when it cannot be.
bool uploadTwiddles(SpectralPrepared &s, int64_t length, double sign) {
  std::vector<double2> w;
  for (const std::complex<double> &t : spectral::twiddles(length, sign)) w.push_back(double2{t.real(), t.imag()});
  return uploadVector(w, s.twiddles);
}

std::shared_ptr<const void> prepareDft(const PrepareContext &p) {
  auto s = std::make_shared<SpectralPrepared>();
  const KernelContext &c = p.kernel;
  TensorView lenView, axisView;
  const TensorView *len, *axis;
  if (!hostView(p, 1, lenView, len) || !hostView(p, 2, axisView, axis)) {
    s->error = "DFT on CUDA needs a constant dft_length and axis";
    return s;
  }
  Status st = spectral::planDft(TensorInfo{c.inputs[0].dtype, c.inputs[0].dims}, c.attrs, len, axis, s->dft);
  if (!st.isOk()) s->error = st.message();
  else if (!uploadTwiddles(*s, s->dft.length, s->dft.inverse ? 1.0 : -1.0)) {
    cudaGetLastError();
    s->error = "DFT on CUDA: cannot hold its twiddle table";
  }
  return s;
}

struct DftLines {
  int64_t outer, n, inner, channels; // the signal around the axis, and its last dim (1 real, 2 complex)
  int64_t length, bins, outChannels;
  bool inverse, onesided;
};

// Value j of the transformed line: the input zero-padded, or for an inverse
// one-sided DFT the Hermitian spectrum of its first L/2 + 1 bins.
template <typename T> __device__ double2 lineValue(const DftLines &g, const T *in, int64_t o, int64_t i, int64_t j) {
  auto read = [&](int64_t at) {
    const T *v = in + ((o * g.n + at) * g.inner + i) * g.channels;
    return double2{double(v[0]), g.channels == 2 ? double(v[1]) : 0.0};
  };
  if (!(g.inverse && g.onesided)) return j < g.n && j < g.length ? read(j) : double2{0.0, 0.0};
  const int64_t half = g.length / 2;
  const bool mirrored = j > half;
  const int64_t k = mirrored ? g.length - j : j;
  if (k >= g.n || (mirrored && (k == 0 || k == j))) return double2{0.0, 0.0};
  double2 v = read(k);
  if (k == 0 || (g.length % 2 == 0 && k == half)) v.y = 0.0;
  if (mirrored) v.y = -v.y;
  return v;
}

template <typename T> __global__ void dftKernel(DftLines g, const double2 *w, const T *in, T *out, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % g.inner, k = (e / g.inner) % g.bins, o = e / (g.inner * g.bins);
    double re = 0, im = 0;
    for (int64_t j = 0, t = 0; j < g.length; ++j, t = (t + k) % g.length) {
      const double2 v = lineValue(g, in, o, i, j), tw = w[t];
      re += v.x * tw.x - v.y * tw.y;
      im += v.x * tw.y + v.y * tw.x;
    }
    const double scale = g.inverse ? 1.0 / double(g.length) : 1.0;
    T *dst = out + ((o * g.bins + k) * g.inner + i) * g.outChannels;
    dst[0] = T(re * scale);
    if (g.outChannels == 2) dst[1] = T(im * scale);
  }
}

Status DftKernel(const KernelContext &c) {
  auto *s = static_cast<const SpectralPrepared *>(c.prepared);
  if (!s) return sdError("DFT was not prepared");
  if (!s->error.empty()) return sdError(s->error);
  const TensorView &x = c.inputs[0];
  const spectral::DftPlan &p = s->dft;
  const AxisExtent e = extentAround(Dims(x.dims.begin(), x.dims.end() - 1), p.axis);
  const DftLines g{e.outer, e.len, e.inner, x.dims.back(), p.length, p.outBins, p.outChannels, p.inverse, p.onesided};
  const int64_t total = g.outer * g.bins * g.inner;
  if (total == 0) return Status::ok();
  if (x.dtype == DType::F64)
    dftKernel<double><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(g, s->twiddles, x.as<double>(),
                                                                      c.outputs[0].as<double>(), total);
  else
    dftKernel<float><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(g, s->twiddles, x.as<float>(),
                                                                     c.outputs[0].as<float>(), total);
  return launchStatus("DFT");
}

std::shared_ptr<const void> prepareStft(const PrepareContext &p) {
  auto s = std::make_shared<SpectralPrepared>();
  const KernelContext &c = p.kernel;
  TensorView stepView, lengthView;
  const TensorView *step, *length;
  if (!hostView(p, 1, stepView, step) || !hostView(p, 3, lengthView, length) || !step) {
    s->error = "STFT on CUDA needs a constant frame_step and frame_length";
    return s;
  }
  const bool hasWindow = c.hasInput(2) && c.inputs[2].data;
  const TensorInfo window{hasWindow ? c.inputs[2].dtype : DType::Undefined, hasWindow ? c.inputs[2].dims : Dims{}};
  Status st = spectral::planStft(TensorInfo{c.inputs[0].dtype, c.inputs[0].dims}, step, hasWindow ? &window : nullptr,
                                 length, c.attrs.getInt("onesided", 1) != 0, s->stft);
  if (!st.isOk()) s->error = st.message();
  else if (!uploadTwiddles(*s, s->stft.frameLength, -1.0)) {
    cudaGetLastError();
    s->error = "STFT on CUDA: cannot hold its twiddle table";
  }
  return s;
}

struct StftFrames {
  int64_t batch, len, channels, step, frameLength, windowLength, frames, bins;
};

template <typename T>
__global__ void stftKernel(StftFrames g, const double2 *w, const T *in, const T *window, T *out, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % g.bins, f = (e / g.bins) % g.frames, b = e / (g.bins * g.frames);
    const int64_t used = g.windowLength < g.frameLength ? g.windowLength : g.frameLength;
    double re = 0, im = 0;
    for (int64_t j = 0, t = 0; j < g.frameLength; ++j, t = (t + k) % g.frameLength) {
      const int64_t at = f * g.step + j;
      double2 v{0.0, 0.0};
      if (j < used && at < g.len) {
        const double gain = window ? double(window[j]) : 1.0;
        const T *x = in + (b * g.len + at) * g.channels;
        v = double2{double(x[0]) * gain, g.channels == 2 ? double(x[1]) * gain : 0.0};
      }
      const double2 tw = w[t];
      re += v.x * tw.x - v.y * tw.y;
      im += v.x * tw.y + v.y * tw.x;
    }
    out[e * 2] = T(re), out[e * 2 + 1] = T(im);
  }
}

Status StftKernel(const KernelContext &c) {
  auto *s = static_cast<const SpectralPrepared *>(c.prepared);
  if (!s) return sdError("STFT was not prepared");
  if (!s->error.empty()) return sdError(s->error);
  const TensorView &x = c.inputs[0];
  const spectral::StftPlan &p = s->stft;
  const StftFrames g{x.dims[0], x.dims[1], x.dims[2], p.step, p.frameLength, p.windowLength, p.frames, p.bins};
  const int64_t total = g.batch * g.frames * g.bins;
  if (total == 0) return Status::ok();
  const bool hasWindow = c.hasInput(2) && c.inputs[2].data;
  if (x.dtype == DType::F64)
    stftKernel<double><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(
        g, s->twiddles, x.as<double>(), hasWindow ? c.inputs[2].as<double>() : nullptr, c.outputs[0].as<double>(), total);
  else
    stftKernel<float><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(
        g, s->twiddles, x.as<float>(), hasWindow ? c.inputs[2].as<float>() : nullptr, c.outputs[0].as<float>(), total);
  return launchStatus("STFT");
}

} // namespace

void registerSpectralKernels() {
  registerKernel("DFT", DftKernel, {DType::F32, DType::F64}, prepareDft);
  registerKernel("STFT", StftKernel, {DType::F32, DType::F64}, prepareStft);
}

} // namespace sd::cuda
