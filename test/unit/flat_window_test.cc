// sd/ops/flat_window.h, the window walks the CUDA conv and pool kernels run,
// checked on the CPU: reachedBy() is tap() inverted and meets outputs in
// increasing order, and the pools' gathered gradient equals the CPU kernel's
// scatter bit for bit (the claim the CUDA MaxPoolGrad/AveragePoolGrad make).
#include "sd/ops/flat_window.h"
#include "sd/ops/kernel.h"
#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace sd {
namespace {

struct Geometry {
  std::string label;
  Dims in, kernel, strides, dilations, pads;
  bool ceil = false, includePad = false;
};

// Ranks 1 to 3; overlapping, gapped, dilated, padded and ceil_mode windows,
// one kernel larger than its stride's step and one global window.
std::vector<Geometry> geometries() {
  return {{"1-d plain", {9}, {3}, {1}, {1}, {0, 0}},
          {"1-d gapped stride", {10}, {2}, {3}, {1}, {0, 0}},
          {"2-d overlapping padded", {7, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}},
          {"2-d count_include_pad", {7, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, true},
          {"2-d dilated asymmetric pads", {8, 9}, {2, 3}, {1, 2}, {2, 1}, {0, 1, 2, 0}},
          {"2-d ceil_mode", {6, 7}, {3, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, true},
          {"2-d ceil_mode count_include_pad", {6, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 0, 1, 0}, true, true},
          {"2-d global", {4, 5}, {4, 5}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
          {"3-d", {4, 5, 3}, {2, 3, 2}, {1, 2, 1}, {1, 1, 2}, {0, 1, 1, 1, 0, 0}}};
}

AttrMap attrsOf(const Geometry &g) {
  AttrMap a;
  a.setInts("kernel_shape", g.kernel);
  a.setInts("strides", g.strides);
  a.setInts("dilations", g.dilations);
  a.setInts("pads", g.pads);
  a.setInt("ceil_mode", g.ceil);
  a.setInt("count_include_pad", g.includePad);
  return a;
}

FlatWindow flatOf(const Geometry &geo) {
  WindowGeometry g;
  Status s = resolveWindows(attrsOf(geo), geo.in, geo.kernel, true, g);
  EXPECT_TRUE(s.isOk()) << geo.label << ": " << s.message();
  StatusOr<FlatWindow> w = flatWindowOf(g);
  EXPECT_TRUE(w.isOk()) << geo.label;
  return w.value();
}

TEST(FlatWindow, ReachedByInvertsTapAndMeetsOutputsInOrder) {
  for (const Geometry &geo : geometries()) {
    FlatWindow w = flatOf(geo);
    // Every (output, tap) pair tap() maps into the input, keyed by input position.
    std::map<int64_t, std::map<int64_t, int64_t>> readers; // ii -> {oo -> kk}
    for (int64_t oo = 0; oo < w.outTotal; ++oo)
      for (int64_t kk = 0; kk < w.kernelTotal; ++kk)
        if (int64_t ii = w.tap(oo, kk); ii >= 0) {
          EXPECT_EQ(readers[ii].count(oo), 0u) << geo.label << ": output " << oo << " reads " << ii << " twice";
          readers[ii][oo] = kk;
        }
    for (int64_t ii = 0; ii < w.inTotal; ++ii) {
      std::map<int64_t, int64_t> found;
      int64_t last = -1;
      for (int64_t kk = w.kernelTotal - 1; kk >= 0; --kk) {
        int64_t oo = w.reachedBy(ii, kk);
        if (oo < 0) continue;
        EXPECT_GT(oo, last) << geo.label << ": input " << ii << " meets output " << oo << " out of order";
        last = oo;
        found[oo] = kk;
      }
      EXPECT_EQ(found, readers[ii]) << geo.label << ": input " << ii;
    }
  }
}

// Runs the CPU kernel `op` and poolGradAt over the same planes.
template <typename T> void expectGatherEqualsCpu(const char *op, const Geometry &geo, std::mt19937 &rng) {
  const int64_t planes = 3;
  FlatWindow w = flatOf(geo);
  // Few distinct values so windows tie (the first maximum wins), one NaN and one Inf per plane.
  std::uniform_int_distribution<int> level(-3, 3);
  std::normal_distribution<double> normal;
  std::vector<T> x(size_t(planes * w.inTotal)), dy(size_t(planes * w.outTotal)), dx(x.size());
  for (T &v : x) v = T(level(rng)) / T(4);
  for (T &v : dy) v = T(normal(rng));
  for (int64_t p = 0; p < planes; ++p) {
    x[size_t(p * w.inTotal + (p + 1) % w.inTotal)] = std::numeric_limits<T>::quiet_NaN();
    x[size_t(p * w.inTotal + (p + 4) % w.inTotal)] = std::numeric_limits<T>::infinity();
  }
  Dims xDims = {1, planes}, dyDims = {1, planes};
  for (int d = 0; d < w.rank; ++d) {
    xDims.push_back(w.in[d]);
    dyDims.push_back(w.out[d]);
  }
  constexpr DType dtype = sizeof(T) == 4 ? DType::F32 : DType::F64;
  AttrMap attrs = attrsOf(geo);
  KernelContext c{attrs, {{dy.data(), dtype, dyDims}, {x.data(), dtype, xDims}}, {{dx.data(), dtype, xDims}}};
  const KernelDef *def = cpuKernels().find(op);
  ASSERT_NE(def, nullptr) << op;
  Status s = def->run(c);
  ASSERT_TRUE(s.isOk()) << op << " " << geo.label << ": " << s.message();
  const bool max = std::string(op) == "MaxPoolGrad";
  for (int64_t p = 0; p < planes; ++p) {
    const T *src = x.data() + p * w.inTotal, *gy = dy.data() + p * w.outTotal;
    auto readX = [src](int64_t off) { return src[off]; };
    auto readDy = [gy](int64_t oo) { return gy[oo]; };
    for (int64_t ii = 0; ii < w.inTotal; ++ii) {
      T gathered = max ? poolGradAt<true, T>(w, ii, readX, readDy, geo.includePad)
                       : poolGradAt<false, T>(w, ii, readX, readDy, geo.includePad);
      T cpu = dx[size_t(p * w.inTotal + ii)];
      EXPECT_EQ(std::memcmp(&gathered, &cpu, sizeof(T)), 0)
          << op << " " << geo.label << " " << sizeof(T) * 8 << "-bit, plane " << p << " input " << ii << ": gathered "
          << gathered << ", CPU " << cpu;
    }
  }
}

TEST(FlatWindow, PoolGradientGatherEqualsTheCpuScatterBitForBit) {
  std::mt19937 rng(7);
  for (const Geometry &geo : geometries())
    for (const char *op : {"MaxPoolGrad", "AveragePoolGrad"}) {
      if (std::string(op) == "MaxPoolGrad" && geo.includePad) continue; // an AveragePool attribute
      expectGatherEqualsCpu<float>(op, geo, rng);
      expectGatherEqualsCpu<double>(op, geo, rng);
    }
}

TEST(FlatWindow, MoreThanThreeSpatialDimsIsAnError) {
  WindowGeometry g;
  g.in = g.kernel = g.strides = g.dilations = g.out = {1, 1, 1, 1};
  g.padBegin = g.padEnd = {0, 0, 0, 0};
  EXPECT_FALSE(flatWindowOf(g).isOk());
}

} // namespace
} // namespace sd
