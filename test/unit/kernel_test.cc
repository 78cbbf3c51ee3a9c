// CPU kernels against plain reference loops on random data.
#include "sd/ops/registry.h"
#include "sd/ops/threadpool.h"
#include <cmath>
#include <gtest/gtest.h>
#include <random>

using namespace sd;

namespace {

struct Tensor {
  DType dtype = DType::F32;
  Dims dims;
  std::vector<double> f64; // backing store for f64
  std::vector<float> f32;
  std::vector<int64_t> i64;
  TensorView view() {
    void *p = dtype == DType::F32 ? (void *)f32.data() : dtype == DType::F64 ? (void *)f64.data() : (void *)i64.data();
    return TensorView{p, dtype, dims};
  }
  float &at(int64_t i) { return f32[size_t(i)]; }
};

Tensor randomF32(Dims dims, std::mt19937 &rng) {
  Tensor t;
  t.dims = dims;
  std::uniform_real_distribution<float> u(-2, 2);
  t.f32.resize(size_t(product(dims)));
  for (float &x : t.f32) x = u(rng);
  return t;
}

Tensor zerosF32(Dims dims) {
  Tensor t;
  t.dims = dims;
  t.f32.assign(size_t(product(dims)), 0.f);
  return t;
}

Tensor i64Tensor(Dims dims, std::vector<int64_t> v) {
  Tensor t;
  t.dtype = DType::I64;
  t.dims = dims;
  t.i64 = std::move(v);
  return t;
}

Status run(const std::string &op, const AttrMap &attrs, std::vector<Tensor *> ins, std::vector<Tensor *> outs,
           ThreadPool *pool = nullptr) {
  const KernelDef *def = cpuKernels().find(op);
  if (!def) return sdError("no kernel ", op);
  KernelContext c{attrs, {}, {}, pool};
  for (Tensor *t : ins) c.inputs.push_back(t ? t->view() : TensorView{});
  for (Tensor *t : outs) c.outputs.push_back(t->view());
  return def->run(c);
}

void expectNear(const std::vector<float> &a, const std::vector<float> &b, float tol = 1e-4f) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << "at " << i;
}

TEST(Kernels, MatMulBatchedBroadcastMatchesReference) {
  std::mt19937 rng(1);
  Tensor a = randomF32({2, 1, 3, 5}, rng), b = randomF32({4, 5, 7}, rng), o = zerosF32({2, 4, 3, 7});
  ASSERT_TRUE(run("MatMul", {}, {&a, &b}, {&o}).isOk());
  std::vector<float> ref(o.f32.size());
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int m = 0; m < 3; ++m)
        for (int n = 0; n < 7; ++n) {
          double s = 0;
          for (int k = 0; k < 5; ++k) s += a.at((i * 3 + m) * 5 + k) * b.at((j * 5 + k) * 7 + n);
          ref[size_t(((i * 4 + j) * 3 + m) * 7 + n)] = float(s);
        }
  expectNear(o.f32, ref);
}

TEST(Kernels, GemmTransposesAlphaBetaBias) {
  std::mt19937 rng(2);
  Tensor a = randomF32({4, 3}, rng), b = randomF32({5, 4}, rng), c = randomF32({5}, rng), o = zerosF32({3, 5});
  AttrMap at;
  at.setInt("transA", 1);
  at.setInt("transB", 1);
  at.setFloat("alpha", 0.5);
  at.setFloat("beta", 2.0);
  ASSERT_TRUE(run("Gemm", at, {&a, &b, &c}, {&o}).isOk());
  for (int m = 0; m < 3; ++m)
    for (int n = 0; n < 5; ++n) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += a.at(k * 3 + m) * b.at(n * 4 + k);
      EXPECT_NEAR(o.at(m * 5 + n), 0.5 * s + 2.0 * c.at(n), 1e-4);
    }
}

TEST(Kernels, LinearBothLayoutsAgree) {
  std::mt19937 rng(3);
  Tensor x = randomF32({2, 3, 4}, rng), w = randomF32({4, 6}, rng), bias = randomF32({6}, rng);
  Tensor wt = zerosF32({6, 4});
  for (int k = 0; k < 4; ++k)
    for (int n = 0; n < 6; ++n) wt.at(n * 4 + k) = w.at(k * 6 + n);
  Tensor o1 = zerosF32({2, 3, 6}), o2 = zerosF32({2, 3, 6});
  AttrMap io, oi;
  io.setString("layout", "io");
  oi.setString("layout", "oi");
  ASSERT_TRUE(run("Linear", io, {&x, &w, &bias}, {&o1}).isOk());
  ASSERT_TRUE(run("Linear", oi, {&x, &wt, &bias}, {&o2}).isOk());
  expectNear(o1.f32, o2.f32);
  double s = bias.at(0);
  for (int k = 0; k < 4; ++k) s += x.at(k) * w.at(k * 6);
  EXPECT_NEAR(o1.at(0), s, 1e-4);
}

TEST(Kernels, SoftmaxAndLogSoftmaxOverMiddleAxis) {
  std::mt19937 rng(4);
  Tensor x = randomF32({2, 5, 3}, rng), s = zerosF32({2, 5, 3}), ls = zerosF32({2, 5, 3});
  AttrMap at;
  at.setInt("axis", 1);
  ASSERT_TRUE(run("Softmax", at, {&x}, {&s}).isOk());
  ASSERT_TRUE(run("LogSoftmax", at, {&x}, {&ls}).isOk());
  for (int o = 0; o < 2; ++o)
    for (int i = 0; i < 3; ++i) {
      double mx = -1e30, sum = 0;
      for (int j = 0; j < 5; ++j) mx = std::max<double>(mx, x.at((o * 5 + j) * 3 + i));
      for (int j = 0; j < 5; ++j) sum += std::exp(x.at((o * 5 + j) * 3 + i) - mx);
      for (int j = 0; j < 5; ++j) {
        int64_t k = (o * 5 + j) * 3 + i;
        EXPECT_NEAR(s.at(k), std::exp(x.at(k) - mx) / sum, 1e-5);
        EXPECT_NEAR(ls.at(k), x.at(k) - mx - std::log(sum), 1e-5);
      }
    }
}

TEST(Kernels, LayerNormMatchesReferenceAndStatistics) {
  std::mt19937 rng(5);
  Tensor x = randomF32({3, 8}, rng), g = randomF32({8}, rng), b = randomF32({8}, rng);
  Tensor y = zerosF32({3, 8}), mean = zerosF32({3, 1}), rstd = zerosF32({3, 1});
  AttrMap at;
  at.setFloat("epsilon", 1e-5);
  ASSERT_TRUE(run("LayerNormalization", at, {&x, &g, &b}, {&y, &mean, &rstd}).isOk());
  for (int r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 8; ++j) m += x.at(r * 8 + j) / 8.0;
    for (int j = 0; j < 8; ++j) v += (x.at(r * 8 + j) - m) * (x.at(r * 8 + j) - m) / 8.0;
    EXPECT_NEAR(mean.at(r), m, 1e-5);
    EXPECT_NEAR(rstd.at(r), 1 / std::sqrt(v + 1e-5), 1e-3);
    for (int j = 0; j < 8; ++j)
      EXPECT_NEAR(y.at(r * 8 + j), (x.at(r * 8 + j) - m) / std::sqrt(v + 1e-5) * g.at(j) + b.at(j), 1e-4);
  }
}

TEST(Kernels, ReductionsOverNonContiguousAxes) {
  std::mt19937 rng(6);
  Tensor x = randomF32({3, 4, 5}, rng), axes = i64Tensor({2}, {0, 2});
  Tensor sum = zerosF32({1, 4, 1}), mx = zerosF32({1, 4, 1}), lse = zerosF32({1, 4, 1});
  ASSERT_TRUE(run("ReduceSum", {}, {&x, &axes}, {&sum}).isOk());
  ASSERT_TRUE(run("ReduceMax", {}, {&x, &axes}, {&mx}).isOk());
  ASSERT_TRUE(run("ReduceLogSumExp", {}, {&x, &axes}, {&lse}).isOk());
  for (int j = 0; j < 4; ++j) {
    double s = 0, m = -1e30, e = 0;
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 5; ++k) {
        double v = x.at((i * 4 + j) * 5 + k);
        s += v;
        m = std::max(m, v);
        e += std::exp(v);
      }
    EXPECT_NEAR(sum.at(j), s, 1e-4);
    EXPECT_NEAR(mx.at(j), m, 1e-6);
    EXPECT_NEAR(lse.at(j), std::log(e), 1e-4);
  }
}

TEST(Kernels, TransposeFourD) {
  std::mt19937 rng(7);
  Tensor x = randomF32({2, 3, 4, 5}, rng), o = zerosF32({4, 2, 5, 3});
  AttrMap at;
  at.setInts("perm", {2, 0, 3, 1});
  ASSERT_TRUE(run("Transpose", at, {&x}, {&o}).isOk());
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c)
        for (int d = 0; d < 5; ++d)
          ASSERT_EQ(o.at(((c * 2 + a) * 5 + d) * 3 + b), x.at(((a * 3 + b) * 4 + c) * 5 + d));
}

TEST(Kernels, BroadcastAddThreadedEqualsSerial) {
  std::mt19937 rng(8);
  Tensor a = randomF32({64, 1, 300}, rng), b = randomF32({7, 300}, rng);
  Tensor o1 = zerosF32({64, 7, 300}), o2 = zerosF32({64, 7, 300});
  ThreadPool pool(4);
  ASSERT_TRUE(run("Add", {}, {&a, &b}, {&o1}).isOk());
  ASSERT_TRUE(run("Add", {}, {&a, &b}, {&o2}, &pool).isOk());
  EXPECT_EQ(o1.f32, o2.f32);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 7; ++j)
      for (int k = 0; k < 300; k += 37) ASSERT_EQ(o1.at((i * 7 + j) * 300 + k), a.at(i * 300 + k) + b.at(j * 300 + k));
}

TEST(Kernels, GatherRejectsOutOfRangeIndex) {
  std::mt19937 rng(9);
  Tensor x = randomF32({4, 3}, rng), o = zerosF32({2, 3});
  Tensor good = i64Tensor({2}, {3, -1}), bad = i64Tensor({2}, {0, 4});
  ASSERT_TRUE(run("Gather", {}, {&x, &good}, {&o}).isOk());
  EXPECT_EQ(o.at(0), x.at(9));
  EXPECT_EQ(o.at(3), x.at(9));
  Status s = run("Gather", {}, {&x, &bad}, {&o});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("out of range"), std::string::npos);
}

TEST(Kernels, SliceNegativeStep) {
  Tensor x = zerosF32({6});
  for (int i = 0; i < 6; ++i) x.at(i) = float(i);
  Tensor starts = i64Tensor({1}, {-1}), ends = i64Tensor({1}, {-100}), axes = i64Tensor({1}, {0}),
         steps = i64Tensor({1}, {-2});
  Tensor o = zerosF32({3});
  ASSERT_TRUE(run("Slice", {}, {&x, &starts, &ends, &axes, &steps}, {&o}).isOk());
  EXPECT_EQ(o.f32, (std::vector<float>{5, 3, 1}));
  Tensor wrong = zerosF32({2});
  EXPECT_FALSE(run("Slice", {}, {&x, &starts, &ends, &axes, &steps}, {&wrong}).isOk());
}

// Naive direct convolution for reference.
std::vector<float> naiveConv(const Tensor &x, const Tensor &w, int64_t group, int64_t stride, int64_t pad,
                             Dims &outDims) {
  int64_t n = x.dims[0], c = x.dims[1], h = x.dims[2], wd = x.dims[3], m = w.dims[0], kh = w.dims[2], kw = w.dims[3];
  int64_t oh = (h + 2 * pad - kh) / stride + 1, ow = (wd + 2 * pad - kw) / stride + 1, cg = c / group, mg = m / group;
  outDims = {n, m, oh, ow};
  std::vector<float> out(size_t(n * m * oh * ow), 0.f);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t z = 0; z < ow; ++z) {
          double acc = 0;
          int64_t g = o / mg;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                int64_t iy = y * stride - pad + i, iz = z * stride - pad + j;
                if (iy < 0 || iy >= h || iz < 0 || iz >= wd) continue;
                acc += double(x.f32[size_t(((b * c + g * cg + ci) * h + iy) * wd + iz)]) *
                       double(w.f32[size_t(((o * cg + ci) * kh + i) * kw + j)]);
              }
          out[size_t(((b * m + o) * oh + y) * ow + z)] = float(acc);
        }
  return out;
}

TEST(Kernels, ConvMatchesNaiveAcrossTilesStridesAndGroups) {
  std::mt19937 rng(10);
  ThreadPool pool(2);
  struct Case { Dims x, w; int64_t group, stride, pad; };
  // The 96x96 case spans several im2col row tiles; batch 1 exercises the
  // split-inside path, batch 3 the per-image path.
  for (const Case &k : {Case{{1, 16, 96, 96}, {8, 16, 3, 3}, 1, 1, 1}, Case{{3, 4, 9, 7}, {6, 2, 3, 3}, 2, 2, 1},
                        Case{{2, 3, 5, 5}, {4, 3, 1, 1}, 1, 1, 0}, Case{{1, 4, 40, 40}, {3, 4, 1, 1}, 1, 1, 0},
                        // Depthwise (direct kernel): stride 1 and 2, a channel multiplier of 2,
                        // a 5x5 window wider than a 4-pixel image.
                        Case{{2, 8, 17, 13}, {8, 1, 3, 3}, 8, 1, 1}, Case{{1, 6, 16, 15}, {6, 1, 3, 3}, 6, 2, 1},
                        Case{{1, 3, 9, 9}, {6, 1, 3, 3}, 3, 1, 0}, Case{{2, 4, 4, 4}, {4, 1, 5, 5}, 4, 1, 2}}) {
    Tensor x = randomF32(k.x, rng), w = randomF32(k.w, rng);
    Dims od;
    std::vector<float> ref = naiveConv(x, w, k.group, k.stride, k.pad, od);
    Tensor o = zerosF32(od);
    AttrMap at;
    at.setInt("group", k.group);
    at.setInts("strides", {k.stride, k.stride});
    at.setInts("pads", {k.pad, k.pad, k.pad, k.pad});
    for (ThreadPool *p : {static_cast<ThreadPool *>(nullptr), &pool}) {
      ASSERT_TRUE(run("Conv", at, {&x, &w, nullptr}, {&o}, p).isOk());
      expectNear(o.f32, ref, 1e-3f);
    }
  }
}

TEST(Kernels, HalfStorageComputesThroughF32) {
  // f16 inputs are widened, added in f32 and rounded back; bf16 likewise.
  for (DType dt : {DType::F16, DType::BF16}) {
    std::vector<uint16_t> a(6), b(6), o(6);
    std::vector<float> fa = {0.5f, -1.25f, 3.0f, 100.0f, -0.125f, 7.5f}, fb = {0.25f, 2.0f, -3.0f, 0.5f, 1.0f, 0.5f};
    for (int i = 0; i < 6; ++i) {
      a[size_t(i)] = dt == DType::F16 ? floatToHalf(fa[size_t(i)]) : floatToBf16(fa[size_t(i)]);
      b[size_t(i)] = dt == DType::F16 ? floatToHalf(fb[size_t(i)]) : floatToBf16(fb[size_t(i)]);
    }
    AttrMap none;
    KernelContext c{none, {TensorView{a.data(), dt, {2, 3}}, TensorView{b.data(), dt, {2, 3}}},
                    {TensorView{o.data(), dt, {2, 3}}}, nullptr};
    ASSERT_TRUE(runKernel(*cpuKernels().find("Add"), c).isOk());
    for (int i = 0; i < 6; ++i) {
      float got = dt == DType::F16 ? halfToFloat(o[size_t(i)]) : bf16ToFloat(o[size_t(i)]);
      EXPECT_EQ(got, fa[size_t(i)] + fb[size_t(i)]) << dtypeName(dt) << " at " << i;
    }
  }
}

TEST(ShapeRules, BroadcastAndReshapeInference) {
  AttrMap none;
  ShapeContext c{none, {TensorInfo{DType::F32, {2, 1, 4}}, TensorInfo{DType::F32, {3, 1}}}, {nullptr, nullptr}, {}, 1};
  ASSERT_TRUE(inferShapes("Add", c).isOk());
  EXPECT_EQ(c.outputs[0].dims, (Dims{2, 3, 4}));
  std::vector<int64_t> shape = {0, -1};
  TensorView sv{shape.data(), DType::I64, {2}};
  ShapeContext r{none, {TensorInfo{DType::F32, {2, 3, 4}}, TensorInfo{DType::I64, {2}}}, {nullptr, &sv}, {}, 1};
  ASSERT_TRUE(inferShapes("Reshape", r).isOk());
  EXPECT_EQ(r.outputs[0].dims, (Dims{2, 12}));
  ShapeContext bad{none, {TensorInfo{DType::F32, {2, 3}}, TensorInfo{DType::F32, {4, 3}}}, {nullptr, nullptr}, {}, 1};
  EXPECT_FALSE(inferShapes("Add", bad).isOk());
}

} // namespace
