#include "conv_depthwise.h"
#include <algorithm>
#include <vector>

namespace sd::cpu {
namespace {

// Output positions o in [0, out) whose input o*s + off lies in [0, in).
void validRange(int64_t in, int64_t out, int64_t s, int64_t off, int64_t &lo, int64_t &hi) {
  lo = off >= 0 ? 0 : (-off + s - 1) / s;
  hi = in - 1 - off < 0 ? 0 : (in - 1 - off) / s + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

struct Plane {
  int64_t H, W, KH, KW, OH, OW, sh, sw, dh, dw, ph, pw;
};

// Per kernel column kw, the output columns [lo[kw], hi[kw]) whose tap is
// inside the image; computed once per convolution (two divisions per tap per
// row cost more than the row's arithmetic).
struct ColumnRanges {
  std::vector<int64_t> lo, hi;
  explicit ColumnRanges(const Plane &p) : lo(size_t(p.KW)), hi(size_t(p.KW)) {
    for (int64_t kw = 0; kw < p.KW; ++kw)
      validRange(p.W, p.OW, p.sw, kw * p.dw - p.pw, lo[size_t(kw)], hi[size_t(kw)]);
  }
};

// Output columns [ow0, ow1) of row oh, one tap at a time with bounds: the
// borders of a row, and whole rows of unusual geometries.
template <typename T>
void rowByTaps(const T *x, const T *w, T *row, const Plane &p, const ColumnRanges &cr, int64_t oh, int64_t ow0,
               int64_t ow1) {
  for (int64_t kh = 0; kh < p.KH; ++kh) {
    int64_t ih = oh * p.sh - p.ph + kh * p.dh;
    if (ih < 0 || ih >= p.H) continue;
    const T *src = x + ih * p.W;
    for (int64_t kw = 0; kw < p.KW; ++kw) {
      int64_t off = kw * p.dw - p.pw;
      int64_t lo = std::max(cr.lo[size_t(kw)], ow0), hi = std::min(cr.hi[size_t(kw)], ow1);
      T wv = w[kh * p.KW + kw];
      for (int64_t ow = lo; ow < hi; ++ow) row[ow] += wv * src[ow * p.sw + off];
    }
  }
}

// 3x3, dilation 1, stride S: the interior of each row (all three columns of
// taps inside the image) accumulates its nine products in registers and
// stores once; the taps of rows cut by the top or bottom edge read `zeros`
// (W zeros) instead: zero weights on a real row would make NaN of an Inf
// there (0 * Inf), where the plain convolution skips the tap.
template <int S>
[[gnu::always_inline]] inline void plane3x3(const float *x, const float *w, float b, float *y, const Plane &p,
                                            const ColumnRanges &cr, const float *zeros) {
  int64_t ilo = std::max(cr.lo[0], cr.lo[2]), ihi = std::max(ilo, std::min(cr.hi[0], cr.hi[2]));
  for (int64_t oh = 0; oh < p.OH; ++oh) {
    float *row = y + oh * p.OW;
    const float *r[3];
    float k[9];
    for (int kh = 0; kh < 3; ++kh) {
      int64_t ih = oh * p.sh - p.ph + kh;
      bool in = ih >= 0 && ih < p.H;
      r[kh] = (in ? x + ih * p.W : zeros) - p.pw;
      for (int kw = 0; kw < 3; ++kw) k[kh * 3 + kw] = w[kh * 3 + kw];
    }
    const float *r0 = r[0], *r1 = r[1], *r2 = r[2];
#pragma omp simd
    for (int64_t ow = ilo; ow < ihi; ++ow) {
      int64_t i = ow * S;
      row[ow] = b + k[0] * r0[i] + k[1] * r0[i + 1] + k[2] * r0[i + 2] + k[3] * r1[i] + k[4] * r1[i + 1] +
                k[5] * r1[i + 2] + k[6] * r2[i] + k[7] * r2[i + 1] + k[8] * r2[i + 2];
    }
    // Border columns: the same nine taps with the input column checked.
    auto border = [&](int64_t ow) {
      float acc = b;
      for (int kw = 0; kw < 3; ++kw) {
        int64_t i = ow * S + kw, col = i - p.pw;
        if (col < 0 || col >= p.W) continue;
        acc += k[kw] * r0[i] + k[3 + kw] * r1[i] + k[6 + kw] * r2[i];
      }
      row[ow] = acc;
    };
    for (int64_t ow = 0; ow < ilo; ++ow) border(ow);
    for (int64_t ow = ihi; ow < p.OW; ++ow) border(ow);
  }
}

// One build per instruction set, picked by cpuid when first called (GCC and
// Clang multiversioning; neither clones templates, hence the wrappers).
__attribute__((target_clones("avx512f", "avx2", "default"))) void plane3x3Stride1(const float *x, const float *w,
                                                                                    float b, float *y,
                                                                                    const Plane &p,
                                                                                    const ColumnRanges &cr,
                                                                                    const float *zeros) {
  plane3x3<1>(x, w, b, y, p, cr, zeros);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void plane3x3Stride2(const float *x, const float *w,
                                                                                    float b, float *y,
                                                                                    const Plane &p,
                                                                                    const ColumnRanges &cr,
                                                                                    const float *zeros) {
  plane3x3<2>(x, w, b, y, p, cr, zeros);
}

template <typename T>
void planeGeneral(const T *x, const T *w, T b, T *y, const Plane &p, const ColumnRanges &cr) {
  for (int64_t oh = 0; oh < p.OH; ++oh) {
    T *row = y + oh * p.OW;
    std::fill(row, row + p.OW, b);
    rowByTaps(x, w, row, p, cr, oh, 0, p.OW);
  }
}

} // namespace

template <typename T>
void depthwiseConv2d(ThreadPool *pool, const T *x, const T *w, const T *bias, T *y, int64_t n, int64_t cin,
                     int64_t mult, const WindowGeometry &g, const ConvEpilogue<T> &epilogue) {
  Plane p{g.in[0],        g.in[1],        g.kernel[0],    g.kernel[1],    g.out[0],       g.out[1],
          g.strides[0],   g.strides[1],   g.dilations[0], g.dilations[1], g.padBegin[0], g.padBegin[1]};
  int64_t inPlane = p.H * p.W, outPlane = p.OH * p.OW, taps = p.KH * p.KW, cout = cin * mult;
  bool k3 = p.KH == 3 && p.KW == 3 && p.dh == 1 && p.dw == 1 && p.sw <= 2;
  ColumnRanges cr(p); // the same for every plane
  const std::vector<float> zeros(size_t(k3 ? p.W : 0), 0.0f); // the rows above and below the image
  // (image x output channel) planes are independent work items.
  parallelFor(pool, n * cout, std::max<int64_t>(1, 4096 / std::max<int64_t>(outPlane * taps, 1)),
              [&](int64_t p0, int64_t p1) {
                for (int64_t i = p0; i < p1; ++i) {
                  int64_t b = i / cout, oc = i % cout;
                  const T *xc = x + (b * cin + oc / mult) * inPlane;
                  const T *wc = w + oc * taps;
                  T bv = bias ? bias[oc] : T(0);
                  T *yc = y + i * outPlane;
                  bool done = false;
                  if constexpr (std::is_same_v<T, float>) {
                    if (k3) (p.sw == 1 ? plane3x3Stride1 : plane3x3Stride2)(xc, wc, bv, yc, p, cr, zeros.data());
                    done = k3;
                  }
                  if (!done) planeGeneral(xc, wc, bv, yc, p, cr);
                  if (epilogue.active()) epilogue.apply(yc, i * outPlane, outPlane);
                }
              });
}

template void depthwiseConv2d<float>(ThreadPool *, const float *, const float *, const float *, float *, int64_t,
                                     int64_t, int64_t, const WindowGeometry &, const ConvEpilogue<float> &);
template void depthwiseConv2d<double>(ThreadPool *, const double *, const double *, const double *, double *,
                                      int64_t, int64_t, int64_t, const WindowGeometry &, const ConvEpilogue<double> &);

} // namespace sd::cpu
