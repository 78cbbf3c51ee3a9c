// CUDA kernels for MatMul, Gemm, Linear and Det. The products go through cuBLASLt plans built
// when the session is created (gemm_lt.h). Linear's bias is cuBLASLt's bias
// epilogue; Gemm's C, and LinearAdd's addend, are cuBLASLt's C (a broadcast
// Gemm C is written into the output first and accumulated with beta). Det:
// one thread per matrix factorizes an f64 copy with the CPU's own LU
// (sd/ops/math/determinant.h), in a scratch allocated with the session.
#include "gemm_lt.h"
#include "sd/ops/math/determinant.h"
#include <memory>

namespace sd::cuda {
namespace {

int64_t product(const Dims &d) {
  int64_t p = 1;
  for (int64_t v : d) p *= v;
  return p;
}

// MatMul's batch split: one strided-batched GEMM when each operand's batch is
// either whole or shared; otherwise one GEMM per output matrix (offsets below).
struct MatMulSplit {
  Dims batch, stridesA, stridesB; // per batch dim, in matrices (0: broadcast)
  int64_t m = 0, n = 0, k = 0, count = 1;
  int64_t countA = 1, countB = 1; // matrices in A and in B
  bool strided = false;
};

MatMulSplit splitMatMul(const KernelContext &c) {
  Dims ad = c.inputs[0].dims, bd = c.inputs[1].dims;
  if (ad.size() == 1) ad.insert(ad.begin(), 1);
  if (bd.size() == 1) bd.push_back(1);
  MatMulSplit s;
  s.m = ad[ad.size() - 2];
  s.k = ad.back();
  s.n = bd.back();
  Dims ba(ad.begin(), ad.end() - 2), bb(bd.begin(), bd.end() - 2);
  size_t r = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), r - ba.size(), 1);
  bb.insert(bb.begin(), r - bb.size(), 1);
  s.batch.resize(r);
  s.stridesA.resize(r);
  s.stridesB.resize(r);
  int64_t sa = 1, sb = 1;
  for (size_t i = r; i-- > 0;) {
    s.batch[i] = std::max(ba[i], bb[i]);
    s.stridesA[i] = ba[i] == 1 ? 0 : sa;
    s.stridesB[i] = bb[i] == 1 ? 0 : sb;
    sa *= ba[i];
    sb *= bb[i];
  }
  s.count = product(s.batch);
  s.countA = product(ba);
  s.countB = product(bb);
  s.strided = (s.countA == s.count || s.countA == 1) && (s.countB == s.count || s.countB == 1);
  return s;
}

GemmShape matMulShape(const KernelContext &c, const MatMulSplit &s) {
  GemmShape g;
  g.m = s.m;
  g.n = s.n;
  g.k = s.k;
  g.lda = s.k;
  g.ldb = s.n;
  g.ldc = s.n;
  g.dtype = c.inputs[0].dtype;
  if (!s.strided) { // one matrix per call, each at its offset
    g.alignBytes = std::min({alignmentOf(s.m * s.k, g.dtype), alignmentOf(s.k * s.n, g.dtype),
                             alignmentOf(s.m * s.n, g.dtype)});
    return g;
  }
  bool aWhole = s.countA == s.count, bWhole = s.countB == s.count;
  if (aWhole && !bWhole) { // B shared, A contiguous: one tall GEMM
    g.m = s.m * s.count;
    return g;
  }
  g.batch = s.count;
  g.strideA = aWhole ? s.m * s.k : 0;
  g.strideB = bWhole ? s.k * s.n : 0;
  g.strideC = s.m * s.n;
  return g;
}

std::shared_ptr<const void> prepareMatMul(const PrepareContext &p) {
  MatMulSplit s = splitMatMul(p.kernel);
  return planGemm(p, matMulShape(p.kernel, s));
}

Status MatMulKernel(const KernelContext &c) {
  auto *g = static_cast<const LtGemm *>(c.prepared);
  if (!g) return sdError("MatMul has no cuBLASLt plan");
  MatMulSplit s = splitMatMul(c);
  if (s.count * s.m * s.n == 0) return Status::ok();
  size_t esize = dtypeSize(c.inputs[0].dtype);
  const char *a = static_cast<const char *>(c.inputs[0].data), *b = static_cast<const char *>(c.inputs[1].data);
  char *o = static_cast<char *>(c.outputs[0].data);
  if (s.k == 0) return cudaCheck(cudaMemsetAsync(o, 0, c.outputs[0].byteSize(), streamOf(c)), "MatMul");
  if (s.strided) return g->run(a, b, o, 1.0, 0.0, streamOf(c));
  for (int64_t i = 0; i < s.count; ++i) {
    int64_t rem = i, offA = 0, offB = 0;
    for (size_t d = s.batch.size(); d-- > 0;) {
      int64_t idx = rem % s.batch[d];
      rem /= s.batch[d];
      offA += idx * s.stridesA[d];
      offB += idx * s.stridesB[d];
    }
    SD_RETURN_IF_ERROR(g->run(a + size_t(offA * s.m * s.k) * esize, b + size_t(offB * s.k * s.n) * esize,
                              o + size_t(i * s.m * s.n) * esize, 1.0, 0.0, streamOf(c)));
  }
  return Status::ok();
}

} // namespace

GemmShape gemmShapeOf(const KernelContext &c) {
  const TensorView &a = c.inputs[0], &b = c.inputs[1], &o = c.outputs[0];
  GemmShape g;
  g.transA = c.attrs.getInt("transA", 0) != 0;
  g.transB = c.attrs.getInt("transB", 0) != 0;
  g.m = o.dims[0];
  g.n = o.dims[1];
  g.k = g.transA ? a.dims[0] : a.dims[1];
  g.lda = a.dims[1];
  g.ldb = b.dims[1];
  g.ldc = g.n;
  g.dtype = a.dtype;
  return g;
}

namespace {

std::shared_ptr<const void> prepareGemm(const PrepareContext &p) { return planGemm(p, gemmShapeOf(p.kernel)); }

Status GemmKernel(const KernelContext &c) {
  auto *g = static_cast<const LtGemm *>(c.prepared);
  if (!g) return sdError("Gemm has no cuBLASLt plan");
  double alpha = c.attrs.getFloat("alpha", 1.0), beta = c.attrs.getFloat("beta", 1.0);
  bool hasC = c.hasInput(2) && c.inputs[2].data && beta != 0.0;
  if (c.outputs[0].numElements() == 0) return Status::ok();
  // A C of the output's own shape is cuBLASLt's C, read where it lies; a
  // broadcast one is written out first and accumulated in place.
  bool wholeC = hasC && c.inputs[2].numElements() == c.outputs[0].numElements() && g->shape.k != 0;
  if (hasC && !wholeC) SD_RETURN_IF_ERROR(broadcastInto(c.inputs[2], c.outputs[0], streamOf(c)));
  if (g->shape.k == 0) {
    if (!hasC) return cudaCheck(cudaMemsetAsync(c.outputs[0].data, 0, c.outputs[0].byteSize(), streamOf(c)), "Gemm");
    return Status::ok(); // beta * C with no product: C is already there only when beta == 1
  }
  return g->run(c.inputs[0].data, c.inputs[1].data, c.outputs[0].data, alpha, hasC ? beta : 0.0, streamOf(c),
                wholeC ? c.inputs[2].data : nullptr);
}

} // namespace

GemmShape linearShapeOf(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &w = c.inputs[1], &o = c.outputs[0];
  GemmShape g;
  g.transB = c.attrs.getString("layout", "io") == "oi";
  g.k = x.dims.back();
  g.n = o.dims.back();
  g.m = g.k ? x.numElements() / g.k : o.numElements() / std::max<int64_t>(g.n, 1);
  g.lda = g.k;
  g.ldb = w.dims[1];
  g.ldc = g.n;
  g.dtype = x.dtype;
  // f64 has no bias epilogue in cuBLASLt; it takes the broadcast path.
  if (c.hasInput(2) && c.inputs[2].data && x.dtype != DType::F64) g.bias = c.inputs[2].data;
  return g;
}

namespace {

std::shared_ptr<const void> prepareLinear(const PrepareContext &p) { return planGemm(p, linearShapeOf(p.kernel)); }

Status LinearKernel(const KernelContext &c) {
  auto *g = static_cast<const LtGemm *>(c.prepared);
  if (!g) return sdError("Linear has no cuBLASLt plan");
  if (c.outputs[0].numElements() == 0) return Status::ok();
  bool hasBias = c.hasInput(2) && c.inputs[2].data;
  bool biasByHand = hasBias && !g->shape.bias;
  if (biasByHand) SD_RETURN_IF_ERROR(broadcastInto(c.inputs[2], c.outputs[0], streamOf(c)));
  if (g->shape.k == 0) {
    if (hasBias) {
      if (!biasByHand) SD_RETURN_IF_ERROR(broadcastInto(c.inputs[2], c.outputs[0], streamOf(c)));
      return Status::ok();
    }
    return cudaCheck(cudaMemsetAsync(c.outputs[0].data, 0, c.outputs[0].byteSize(), streamOf(c)), "Linear");
  }
  return g->run(c.inputs[0].data, c.inputs[1].data, c.outputs[0].data, 1.0, biasByHand ? 1.0 : 0.0, streamOf(c));
}

// LinearAdd: Linear plus an addend of the output's shape, read as cuBLASLt's
// C beside the bias epilogue (f64, which has no bias epilogue, stays Linear).
Status LinearAddKernel(const KernelContext &c) {
  auto *g = static_cast<const LtGemm *>(c.prepared);
  if (!g) return sdError("LinearAdd has no cuBLASLt plan");
  const TensorView &addend = c.inputs[3], &out = c.outputs[0];
  if (out.numElements() == 0) return Status::ok();
  if (addend.numElements() != out.numElements() || addend.dtype != out.dtype)
    return sdError("LinearAdd's addend must have the output's shape and type");
  bool hasBias = c.hasInput(2) && c.inputs[2].data;
  if (hasBias && !g->shape.bias) return sdError("LinearAdd takes f32, bf16 or f16 on CUDA");
  if (g->shape.k == 0) {
    if (hasBias) return sdError("LinearAdd with a bias needs a non-empty inner dimension");
    if (addend.data == out.data) return Status::ok();
    return cudaCheck(cudaMemcpyAsync(out.data, addend.data, out.byteSize(), cudaMemcpyDeviceToDevice, streamOf(c)),
                     "LinearAdd");
  }
  return g->run(c.inputs[0].data, c.inputs[1].data, out.data, 1.0, 1.0, streamOf(c), addend.data);
}

template <typename T> __global__ void detKernel(const T *x, T *y, double *scratch, int64_t batch, int64_t m) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < batch; b += int64_t(gridDim.x) * blockDim.x) {
    double *a = scratch + b * m * m;
    for (int64_t i = 0; i < m * m; ++i) a[i] = double(load(x[b * m * m + i]));
    y[b] = store<T>(Compute<T>(math::luDeterminant(a, m)));
  }
}

// An f64 copy of every matrix, factorized in place.
std::shared_ptr<const void> prepareDet(const PrepareContext &p) {
  return deviceScratch(size_t(p.kernel.inputs[0].numElements()) * sizeof(double));
}

Status DetKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  if (x.rank() < 2 || x.dims[size_t(x.rank() - 1)] != x.dims[size_t(x.rank() - 2)])
    return sdError("Det takes square matrices, got ", formatDims(x.dims));
  const DeviceScratch *s = scratchOf(c);
  if (!s) return sdError("Det on CUDA: cannot allocate its scratch");
  const int64_t batch = y.numElements(), m = x.dims.back();
  if (batch == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    detKernel<T><<<blocksFor(batch), kThreads, 0, streamOf(c)>>>(x.as<T>(), y.as<T>(), s->as<double>(), batch, m);
    return launchStatus("Det");
  });
}

} // namespace

void registerLinalgKernels() {
  TypeSet t = floatStorage();
  registerKernel("MatMul", MatMulKernel, t, prepareMatMul);
  registerKernel("Gemm", GemmKernel, t, prepareGemm);
  registerKernel("Det", DetKernel, TypeSet::floats(), prepareDet); // f32 and f64, as on the CPU
  registerKernel("Linear", LinearKernel, t, prepareLinear);
  registerKernel("LinearAdd", LinearAddKernel, {DType::F32, DType::F16, DType::BF16}, prepareLinear);
}

} // namespace sd::cuda
