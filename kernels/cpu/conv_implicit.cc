// Implicit-GEMM convolution (see conv_implicit.h).
//
// The output is computed on a grid as wide as the rows B is read from:
// output pixel (oh, ow) is grid column oh * Wq + ow, so each kernel tap
// (kh, kw) is one fixed shift of an input plane, and B's row for (c, kh, kw)
// is that plane read from the tap's shift on. Grid columns with ow >= OW are
// computed too and dropped when the grid is copied out (2 of 34 for a
// 32-wide image and a 3x3 kernel).
//
// With stride s the padded input is split into s x s phase planes,
// plane (ph, pw)[i][j] = padded[i * s + ph][j * s + pw], and tap (kh, kw)
// reads plane ((kh * dh) % s, (kw * dw) % s) shifted by (kh * dh) / s rows and
// (kw * dw) / s columns: a strided convolution becomes a stride-1 one over
// the phases its taps use (all four for a 3x3 stride-2 kernel, one for 1x1).
#include "conv_implicit.h"
#include "cpu_util.h"
#include <algorithm>
#include <string_view>

namespace sd::cpu {

bool implicitConvApplies(const WindowGeometry &g) { return g.rank() == 2; }

namespace {

// Grow-only per-thread scratch: the pool's threads keep theirs between runs,
// so a steady-state step allocates nothing.
float *scratch(std::vector<float> &buffer, size_t floats) {
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

} // namespace

void implicitConv2d(ThreadPool *pool, const float *x, const float *w, const std::vector<PackedA> *packedGroups,
                    const float *bias, float *y, int64_t n, int64_t cin, int64_t m, int64_t group,
                    const WindowGeometry &g, const ConvEpilogue<float> &epilogue) {
  int64_t H = g.in[0], W = g.in[1], KH = g.kernel[0], KW = g.kernel[1], dh = g.dilations[0], dw = g.dilations[1];
  int64_t sh = g.strides[0], sw = g.strides[1], padTop = g.padBegin[0], padLeft = g.padBegin[1];
  int64_t OH = g.out[0], OW = g.out[1], cg = cin / group, mg = m / group, k = cg * KH * KW;
  int64_t reachH = (KH - 1) * dh / sh, reachW = (KW - 1) * dw / sw, Wq = OW + reachW;
  // A grid as wide as the output (1-wide kernels) is the output's own layout:
  // the GEMM writes there and nothing is copied.
  bool direct = Wq == OW;
  // Stride 1 without padding reads the input where it is: no copy at all.
  bool inPlace = sh == 1 && sw == 1 && !padTop && !padLeft && !g.padEnd[0] && !g.padEnd[1];
  // The phases some tap reads, numbered in order of first use.
  std::vector<int64_t> phaseOf(static_cast<size_t>(sh * sw), -1);
  std::vector<std::pair<int64_t, int64_t>> phases;
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) {
      int64_t ph = kh * dh % sh, pw = kw * dw % sw;
      if (phaseOf[size_t(ph * sw + pw)] < 0) {
        phaseOf[size_t(ph * sw + pw)] = int64_t(phases.size());
        phases.push_back({ph, pw});
      }
    }
  // Row tiles: a tile's input planes are kept near 256 KiB so they stay in L2
  // while the GEMM walks them, but at least 4 register panels wide; at least
  // 4 work items (images x groups x tiles) per thread. With our GEMM kernels
  // each output element is one dot product over all of k whatever the
  // tiling, so results do not depend on it (nor on the thread count). The
  // system BLAS (no AVX2, or SD_CPU_ISA=generic) sums k in blocks or in one
  // run by the product's shape (OpenBLAS's small-matrix kernels): there the
  // cut is 16 items whatever the thread count.
  int64_t planes = int64_t(phases.size()) * cg;
  int64_t tileRows = std::clamp<int64_t>((int64_t(1) << 16) / std::max<int64_t>(planes * Wq, 1) - reachH, 1, OH);
  if (!direct) // and the grid the GEMM writes (copied out after) within 512 KiB
    tileRows = std::clamp<int64_t>((int64_t(1) << 17) / std::max<int64_t>(mg * Wq, 1), 1, tileRows);
  int64_t units = n * group, threads = pool ? pool->size() : 1, minRows = std::min<int64_t>(OH, (128 + Wq - 1) / Wq);
  const int64_t spread = std::string_view(sgemmIsa()) == "generic" ? 16 : 4 * threads;
  if (units * ((OH + tileRows - 1) / tileRows) < spread)
    tileRows = std::clamp<int64_t>(OH * units / spread, minRows, tileRows);
  int64_t tiles = (OH + tileRows - 1) / tileRows;
  int64_t planeStride = inPlace ? H * W : (tileRows + reachH) * Wq;
  std::vector<int64_t> offsets(static_cast<size_t>(k));
  for (int64_t c = 0; c < cg; ++c)
    for (int64_t kh = 0; kh < KH; ++kh)
      for (int64_t kw = 0; kw < KW; ++kw) {
        int64_t phase = phaseOf[size_t((kh * dh % sh) * sw + kw * dw % sw)];
        offsets[static_cast<size_t>((c * KH + kh) * KW + kw)] =
            (phase * cg + c) * planeStride + (kh * dh / sh) * Wq + kw * dw / sw;
      }
  auto runItems = [&](int64_t i0, int64_t i1, ThreadPool *inner) {
    thread_local std::vector<float> inputTile, gridTile;
    float *xp = inPlace ? nullptr : scratch(inputTile, static_cast<size_t>(planes * planeStride));
    float *grid = direct ? nullptr : scratch(gridTile, static_cast<size_t>(mg * tileRows * Wq));
    for (int64_t item = i0; item < i1; ++item) {
      int64_t t = item % tiles, gi = (item / tiles) % group, b = item / tiles / group;
      int64_t oh0 = t * tileRows, rows = std::min(OH, oh0 + tileRows) - oh0;
      const float *xg = x + (b * cin + gi * cg) * H * W, *src = xg + oh0 * W;
      if (!inPlace) { // the tile's phase planes, zero where they fall into padding
        src = xp;
        for (size_t q = 0; q < phases.size(); ++q)
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < rows + reachH; ++i) {
              float *dst = xp + (int64_t(q) * cg + c) * planeStride + i * Wq;
              int64_t ih = (oh0 + i) * sh + phases[q].first - padTop, w0 = phases[q].second - padLeft;
              if (ih < 0 || ih >= H) {
                std::fill(dst, dst + Wq, 0.0f);
                continue;
              }
              const float *row = xg + (c * H + ih) * W;
              if (sw == 1) { // a zero border and one copy
                int64_t lo = std::clamp<int64_t>(-w0, 0, Wq), hi = std::clamp<int64_t>(W - w0, lo, Wq);
                std::fill(dst, dst + lo, 0.0f);
                std::copy(row + lo + w0, row + hi + w0, dst + lo);
                std::fill(dst + hi, dst + Wq, 0.0f);
              } else {
                for (int64_t j = 0; j < Wq; ++j) {
                  int64_t iw = j * sw + w0;
                  dst[j] = iw >= 0 && iw < W ? row[iw] : 0.0f;
                }
              }
            }
      }
      int64_t cols = (rows - 1) * Wq + OW; // the last grid row stops at the last real output
      const PackedA *packed = packedGroups && !packedGroups->empty() ? &(*packedGroups)[size_t(gi)] : nullptr;
      int64_t at0 = (b * m + gi * mg) * OH * OW + oh0 * OW; // output channel gi * mg, row oh0
      sgemmIndirectB(inner, false, mg, cols, k, w + gi * mg * k, k, src, offsets.data(), 0.0f,
                     direct ? y + at0 : grid, direct ? OH * OW : cols, packed);
      for (int64_t j = 0; j < mg; ++j) {
        int64_t at = at0 + j * OH * OW;
        if (!direct)
          for (int64_t r = 0; r < rows; ++r) std::copy_n(grid + j * cols + r * Wq, OW, y + at + r * OW);
        float add = bias ? bias[gi * mg + j] : 0.0f;
        if (add != 0.0f || epilogue.active()) epilogue.apply(y + at, at, rows * OW, add);
      }
    }
  };
  int64_t items = units * tiles;
  if (items < threads) runItems(0, items, pool);
  else parallelFor(pool, items, 1, [&](int64_t a, int64_t e) { runItems(a, e, nullptr); });
}

} // namespace sd::cpu
