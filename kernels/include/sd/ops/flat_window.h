// A sliding window's geometry (window_geometry.h) in fixed arrays of up to 3
// spatial dims, passed by value to GPU kernels. Its walks are SD_HD, so the
// CPU unit tests check the index arithmetic the CUDA conv and pool kernels
// run (test/unit/shared_math_test.cc).
#pragma once
#include "sd/ops/math/host_device.h"
#include "sd/ops/window_geometry.h"

namespace sd {

constexpr int kMaxFlatWindowRank = 3;

struct FlatWindow {
  int rank = 0;
  int64_t in[kMaxFlatWindowRank] = {}, out[kMaxFlatWindowRank] = {}, kernel[kMaxFlatWindowRank] = {},
          strides[kMaxFlatWindowRank] = {}, dilations[kMaxFlatWindowRank] = {}, padBegin[kMaxFlatWindowRank] = {},
          padEnd[kMaxFlatWindowRank] = {};
  int64_t inTotal = 1, outTotal = 1, kernelTotal = 1;

  // Input offset (within one plane) of tap kk for output position oo, or -1 in padding.
  SD_HD int64_t tap(int64_t oo, int64_t kk) const {
    int64_t off = 0, inStride = 1;
    bool inside = true;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t o = oo % out[d], k = kk % kernel[d];
      oo /= out[d];
      kk /= kernel[d];
      const int64_t pos = o * strides[d] - padBegin[d] + k * dilations[d];
      inside = inside && pos >= 0 && pos < in[d];
      off += pos * inStride;
      inStride *= in[d];
    }
    return inside ? off : -1;
  }

  // The gather side of tap(): the output position (within one plane) whose
  // tap kk reads input position ii, or -1 when none does. Visiting kk from
  // kernelTotal - 1 down to 0 meets the outputs in increasing order, which is
  // how the gradient kernels add in the CPU's scatter order.
  SD_HD int64_t reachedBy(int64_t ii, int64_t kk) const {
    int64_t off = 0, outStride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t i = ii % in[d], k = kk % kernel[d];
      ii /= in[d];
      kk /= kernel[d];
      const int64_t t = i + padBegin[d] - k * dilations[d];
      if (t < 0 || t % strides[d]) return -1;
      const int64_t o = t / strides[d];
      if (o >= out[d]) return -1;
      off += o * outStride;
      outStride *= out[d];
    }
    return off;
  }

  // How many taps of output oo fall inside the padded input: AveragePool's
  // divisor with count_include_pad (kernels/cpu/pool.cc's padCountOf).
  SD_HD int64_t padCount(int64_t oo) const {
    int64_t count = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t o = oo % out[d];
      oo /= out[d];
      const int64_t start = o * strides[d] - padBegin[d];
      int64_t end = start + (kernel[d] - 1) * dilations[d] + 1;
      end = end < in[d] + padEnd[d] ? end : in[d] + padEnd[d];
      count *= (end - start + dilations[d] - 1) / dilations[d];
    }
    return count;
  }
};

inline StatusOr<FlatWindow> flatWindowOf(const WindowGeometry &g) {
  if (g.rank() > size_t(kMaxFlatWindowRank)) return sdError("the CUDA backend takes windows of up to 3 spatial dims");
  FlatWindow w;
  w.rank = int(g.rank());
  for (int d = 0; d < w.rank; ++d) {
    const size_t u = size_t(d);
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

// MaxPoolGrad / AveragePoolGrad at input position ii of one plane, as a
// gather: the sum of the gradients `dy` of every window that reads ii, for Max
// only where ii is the window's first maximum (a NaN wins only as the first
// tap, as in the forward), for Avg divided by the forward's count. Windows are
// met in increasing order, the order the CPU kernel scatters them in.
// `x(off)` and `dy(oo)` read one plane in the compute type C.
template <bool Max, typename C, typename ReadX, typename ReadDy>
SD_HD C poolGradAt(const FlatWindow &w, int64_t ii, const ReadX &x, const ReadDy &dy, bool includePad) {
  C acc = C(0);
  for (int64_t kk = w.kernelTotal - 1; kk >= 0; --kk) {
    const int64_t oo = w.reachedBy(ii, kk);
    if (oo < 0) continue;
    int64_t best = -1, count = 0;
    for (int64_t t = 0; t < w.kernelTotal; ++t) {
      const int64_t off = w.tap(oo, t);
      if (off < 0) continue;
      ++count;
      if (Max && (best < 0 || x(off) > x(best))) best = off;
    }
    if (Max) {
      if (best == ii) acc += dy(oo);
    } else {
      const int64_t divisor = includePad ? w.padCount(oo) : count;
      acc += dy(oo) / C(divisor > 1 ? divisor : 1);
    }
  }
  return acc;
}

} // namespace sd
