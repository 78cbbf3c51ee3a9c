// CUDA kernels of orthogonal subspace fine-tuning (f32), the semantics of
// kernels/cpu/osft.cc: every product is a cuBLASLt GEMM planned when the
// session is created, with the scratch (x V^T, dy U and the like) allocated
// then too, so a step allocates nothing and captures into a CUDA graph. The
// small element-wise parts (diag(S) scaling, dS's column dots, the bias) are
// kernels here.
#include "gemm_lt.h"
#include "sd/ops/communicator.h"
#include <memory>
#include <vector>

namespace sd::cuda {
namespace {

__global__ void scaleColumnsKernel(float *a, int64_t rows, int64_t cols, const float *s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x)
    a[i] *= s[i % cols];
}

__global__ void scaleRowsKernel(float *a, int64_t rows, int64_t cols, const float *s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x)
    a[i] *= s[i / cols];
}

// out[j] = sum over rows of a[t, j] * b[t, j], accumulated in f64 (one thread per column).
__global__ void columnDotKernel(const float *a, const float *b, int64_t rows, int64_t cols, float *out) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < cols; j += int64_t(gridDim.x) * blockDim.x) {
    double acc = 0;
    for (int64_t t = 0; t < rows; ++t) acc += double(a[t * cols + j]) * double(b[t * cols + j]);
    out[j] = float(acc);
  }
}

Status scaleColumns(float *a, int64_t rows, int64_t cols, const float *s, cudaStream_t st) {
  if (rows * cols == 0) return Status::ok();
  scaleColumnsKernel<<<blocksFor(rows * cols), kThreads, 0, st>>>(a, rows, cols, s);
  return launchStatus("OSFT diag(S)");
}

Status scaleRows(float *a, int64_t rows, int64_t cols, const float *s, cudaStream_t st) {
  if (rows * cols == 0) return Status::ok();
  scaleRowsKernel<<<blocksFor(rows * cols), kThreads, 0, st>>>(a, rows, cols, s);
  return launchStatus("OSFT diag(S)");
}

Status columnDot(const float *a, const float *b, int64_t rows, int64_t cols, float *out, cudaStream_t st) {
  if (cols == 0) return Status::ok();
  columnDotKernel<<<blocksFor(cols), kThreads, 0, st>>>(a, b, rows, cols, out);
  return launchStatus("OSFT dS");
}

GemmShape shapeOf(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  GemmShape g;
  g.transA = ta, g.transB = tb, g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  return g;
}

// The GEMM plans and scratch of one step, in the order its kernel uses them.
struct OsftPrepared : PreparedError {
  std::vector<std::shared_ptr<LtGemm>> gemms;
  std::vector<float *> scratch;
  ~OsftPrepared() {
    for (float *s : scratch) cudaFree(s);
  }
  void plan(const PrepareContext &p, const GemmShape &g) { gemms.push_back(planGemm(p, g)); }
  bool alloc(int64_t floats) {
    float *s = nullptr;
    if (cudaMalloc(&s, size_t(std::max<int64_t>(1, floats)) * sizeof(float)) != cudaSuccess) {
      cudaGetLastError();
      error = "cannot allocate OSFT's " + std::to_string((floats * 4) >> 20) + " MiB scratch";
      return false;
    }
    scratch.push_back(s);
    return true;
  }
};

const OsftPrepared *preparedOf(const KernelContext &c, const char *op, Status &st) {
  auto *a = static_cast<const OsftPrepared *>(c.prepared);
  if (!a) st = sdError(op, " was not prepared");
  else if (!a->error.empty()) st = sdError(a->error);
  return st.isOk() ? a : nullptr;
}

// Operand `first`..`first + 2` as (U, S, V): U [out, k], S [k], V [k, in].
struct Half {
  const float *u, *s, *v;
  int64_t k;
};
Half halfAt(const KernelContext &c, size_t first) {
  return {c.inputs[first].as<float>(), c.inputs[first + 1].as<float>(), c.inputs[first + 2].as<float>(),
          c.inputs[first + 1].dims[0]};
}

struct LinearGeometry {
  int64_t rows, in, out;
};
LinearGeometry linearGeometry(const TensorView &x, const TensorView &y) {
  int64_t in = x.dims.back(), out = y.dims.back();
  return {in ? x.numElements() / in : 0, in, out};
}

// OsftLinear: per half, a = x V^T [rows, k] (scratch), a *= S, y (+)= a U^T.
std::shared_ptr<const void> prepareOsftLinear(const PrepareContext &p) {
  auto a = std::make_shared<OsftPrepared>();
  const KernelContext &c = p.kernel;
  LinearGeometry g = linearGeometry(c.inputs[0], c.outputs[0]);
  int64_t kMax = std::max(c.inputs[2].dims[0], c.inputs[5].dims[0]);
  if (!a->alloc(g.rows * kMax)) return a;
  for (size_t first : {size_t(1), size_t(4)}) {
    int64_t k = c.inputs[first + 1].dims[0];
    a->plan(p, shapeOf(false, true, g.rows, k, g.in, g.in, g.in, k));
    a->plan(p, shapeOf(false, true, g.rows, g.out, k, k, k, g.out));
  }
  return a;
}

Status OsftLinearKernel(const KernelContext &c) {
  Status st;
  const OsftPrepared *a = preparedOf(c, "OsftLinear", st);
  if (!a) return st;
  LinearGeometry g = linearGeometry(c.inputs[0], c.outputs[0]);
  if (g.rows * g.out == 0) return Status::ok();
  cudaStream_t s = streamOf(c);
  float *y = c.outputs[0].as<float>(), *t = a->scratch[0];
  bool bias = c.hasInput(7) && c.inputs[7].data;
  if (bias) SD_RETURN_IF_ERROR(broadcastInto(c.inputs[7], c.outputs[0], s));
  for (int half = 0; half < 2; ++half) {
    Half h = halfAt(c, 1 + 3 * half);
    SD_RETURN_IF_ERROR(a->gemms[2 * half]->run(c.inputs[0].data, h.v, t, 1.0, 0.0, s));
    SD_RETURN_IF_ERROR(scaleColumns(t, g.rows, h.k, h.s, s));
    SD_RETURN_IF_ERROR(a->gemms[2 * half + 1]->run(t, h.u, y, 1.0, (half || bias) ? 1.0 : 0.0, s));
  }
  return Status::ok();
}

// OsftLinearGrad: g = dy U_low, a = x V_low^T (scratch [rows, r] each),
// dS = coldot(g, a); dU = dy^T (a S); dV = (g S)^T x; with input_grad:
// gh = dy U_high S_high (scratch [rows, k]), dx = gh V_high + (g S) V_low.
std::shared_ptr<const void> prepareOsftLinearGrad(const PrepareContext &p) {
  auto a = std::make_shared<OsftPrepared>();
  const KernelContext &c = p.kernel;
  LinearGeometry g = linearGeometry(c.inputs[1], c.inputs[0]);
  int64_t k = c.inputs[3].dims[0], r = c.inputs[6].dims[0];
  if (!a->alloc(g.rows * r) || !a->alloc(g.rows * r) || !a->alloc(g.rows * k)) return a;
  a->plan(p, shapeOf(false, false, g.rows, r, g.out, g.out, r, r));      // g = dy U_low
  a->plan(p, shapeOf(false, true, g.rows, r, g.in, g.in, g.in, r));      // a = x V_low^T
  a->plan(p, shapeOf(true, false, g.out, r, g.rows, g.out, r, r));       // dU = dy^T a
  a->plan(p, shapeOf(true, false, r, g.in, g.rows, r, g.in, g.in));      // dV = g^T x
  a->plan(p, shapeOf(false, false, g.rows, k, g.out, g.out, k, k));      // gh = dy U_high
  a->plan(p, shapeOf(false, false, g.rows, g.in, k, k, g.in, g.in));     // dx = gh V_high
  a->plan(p, shapeOf(false, false, g.rows, g.in, r, r, g.in, g.in));     // dx += g V_low
  return a;
}

Status OsftLinearGradKernel(const KernelContext &c) {
  Status st;
  const OsftPrepared *a = preparedOf(c, "OsftLinearGrad", st);
  if (!a) return st;
  LinearGeometry g = linearGeometry(c.inputs[1], c.inputs[0]);
  Half hi = halfAt(c, 2), lo = halfAt(c, 5);
  cudaStream_t s = streamOf(c);
  float *gl = a->scratch[0], *al = a->scratch[1], *gh = a->scratch[2];
  float *dx = c.outputs[0].as<float>(), *du = c.outputs[1].as<float>(), *ds = c.outputs[2].as<float>(),
        *dv = c.outputs[3].as<float>();
  if (g.rows == 0) { // no tokens: zero gradients
    SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(du, 0, c.outputs[1].byteSize(), s), "OsftLinearGrad"));
    SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(ds, 0, c.outputs[2].byteSize(), s), "OsftLinearGrad"));
    return cudaCheck(cudaMemsetAsync(dv, 0, c.outputs[3].byteSize(), s), "OsftLinearGrad");
  }
  const void *dy = c.inputs[0].data, *x = c.inputs[1].data;
  SD_RETURN_IF_ERROR(a->gemms[0]->run(dy, lo.u, gl, 1.0, 0.0, s));
  SD_RETURN_IF_ERROR(a->gemms[1]->run(x, lo.v, al, 1.0, 0.0, s));
  SD_RETURN_IF_ERROR(columnDot(gl, al, g.rows, lo.k, ds, s));
  SD_RETURN_IF_ERROR(scaleColumns(al, g.rows, lo.k, lo.s, s));
  SD_RETURN_IF_ERROR(scaleColumns(gl, g.rows, lo.k, lo.s, s));
  SD_RETURN_IF_ERROR(a->gemms[2]->run(dy, al, du, 1.0, 0.0, s));
  SD_RETURN_IF_ERROR(a->gemms[3]->run(gl, x, dv, 1.0, 0.0, s));
  if (!c.attrs.getInt("input_grad", 1)) return Status::ok();
  SD_RETURN_IF_ERROR(a->gemms[4]->run(dy, hi.u, gh, 1.0, 0.0, s));
  SD_RETURN_IF_ERROR(scaleColumns(gh, g.rows, hi.k, hi.s, s));
  SD_RETURN_IF_ERROR(a->gemms[5]->run(gh, hi.v, dx, 1.0, 0.0, s));
  return a->gemms[6]->run(gl, lo.v, dx, 1.0, 1.0, s);
}

// OsftCompose: per half, us = U S (scratch [out, k]), W (+)= us V.
std::shared_ptr<const void> prepareOsftCompose(const PrepareContext &p) {
  auto a = std::make_shared<OsftPrepared>();
  const KernelContext &c = p.kernel;
  int64_t out = c.outputs[0].dims[0], in = c.outputs[0].dims[1];
  int64_t kMax = std::max(c.inputs[1].dims[0], c.inputs[4].dims[0]);
  if (!a->alloc(out * kMax)) return a;
  for (size_t first : {size_t(0), size_t(3)}) {
    int64_t k = c.inputs[first + 1].dims[0];
    a->plan(p, shapeOf(false, false, out, in, k, k, in, in));
  }
  return a;
}

Status OsftComposeKernel(const KernelContext &c) {
  Status st;
  const OsftPrepared *a = preparedOf(c, "OsftCompose", st);
  if (!a) return st;
  int64_t out = c.outputs[0].dims[0];
  cudaStream_t s = streamOf(c);
  float *us = a->scratch[0];
  for (int half = 0; half < 2; ++half) {
    Half h = halfAt(c, 3 * half);
    SD_RETURN_IF_ERROR(cudaCheck(cudaMemcpyAsync(us, h.u, size_t(out * h.k) * sizeof(float),
                                                 cudaMemcpyDeviceToDevice, s), "OsftCompose"));
    SD_RETURN_IF_ERROR(scaleColumns(us, out, h.k, h.s, s));
    SD_RETURN_IF_ERROR(a->gemms[half]->run(us, h.v, c.outputs[0].data, 1.0, half ? 1.0 : 0.0, s));
  }
  return Status::ok();
}

// OsftComposeGrad: P = dW V^T into dU, dS = coldot(U, P), dU = P S,
// dV = S (U^T dW).
std::shared_ptr<const void> prepareOsftComposeGrad(const PrepareContext &p) {
  auto a = std::make_shared<OsftPrepared>();
  const KernelContext &c = p.kernel;
  int64_t out = c.inputs[0].dims[0], in = c.inputs[0].dims[1], r = c.inputs[2].dims[0];
  a->plan(p, shapeOf(false, true, out, r, in, in, in, r));
  a->plan(p, shapeOf(true, false, r, in, out, r, in, in));
  return a;
}

Status OsftComposeGradKernel(const KernelContext &c) {
  Status st;
  const OsftPrepared *a = preparedOf(c, "OsftComposeGrad", st);
  if (!a) return st;
  Half lo = halfAt(c, 1);
  int64_t out = c.inputs[0].dims[0], in = c.inputs[0].dims[1];
  cudaStream_t s = streamOf(c);
  float *du = c.outputs[0].as<float>(), *ds = c.outputs[1].as<float>(), *dv = c.outputs[2].as<float>();
  SD_RETURN_IF_ERROR(a->gemms[0]->run(c.inputs[0].data, lo.v, du, 1.0, 0.0, s));
  SD_RETURN_IF_ERROR(columnDot(lo.u, du, out, lo.k, ds, s));
  SD_RETURN_IF_ERROR(scaleColumns(du, out, lo.k, lo.s, s));
  SD_RETURN_IF_ERROR(a->gemms[1]->run(lo.u, c.inputs[0].data, dv, 1.0, 0.0, s));
  return scaleRows(dv, lo.k, in, lo.s, s);
}

// The (x, high) pairs from operand `first` on: each pair's GEMM and where
// its coefficients start.
struct Pairs {
  std::vector<int64_t> sides, offsets;
};
Pairs pairsOf(const KernelContext &c, size_t first) {
  Pairs p;
  p.sides = c.attrs.getInts("sides");
  p.offsets.assign(p.sides.size() + 1, 0);
  for (size_t i = 0; i < p.sides.size(); ++i) {
    const TensorView &x = c.inputs[first + 2 * i], &h = c.inputs[first + 2 * i + 1];
    p.offsets[i + 1] = p.offsets[i] + (p.sides[i] == 0 ? h.dims[1] * x.dims[1] : x.dims[0] * h.dims[0]);
  }
  return p;
}

// OsftCoefficients: side 0 C = high^T x [k, r]; side 1 C = x high^T [r, k].
std::shared_ptr<const void> prepareOsftCoefficients(const PrepareContext &p) {
  auto a = std::make_shared<OsftPrepared>();
  const KernelContext &c = p.kernel;
  Pairs pairs = pairsOf(c, 0);
  for (size_t i = 0; i < pairs.sides.size(); ++i) {
    const TensorView &x = c.inputs[2 * i], &h = c.inputs[2 * i + 1];
    if (pairs.sides[i] == 0)
      a->plan(p, shapeOf(true, false, h.dims[1], x.dims[1], x.dims[0], h.dims[1], x.dims[1], x.dims[1]));
    else
      a->plan(p, shapeOf(false, true, x.dims[0], h.dims[0], x.dims[1], x.dims[1], x.dims[1], h.dims[0]));
  }
  return a;
}

// --shard params splits OSFT's factors by rows over the ranks; the CPU
// kernels lay out each rank's partial products in the whole tensors' layout
// (kernels/cpu/osft.cc). Not built here: refused by name rather than summed
// in a layout that differs by rank. One rank holds every row: nothing differs.
Status requireWholeRows(const KernelContext &c, const char *op) {
  if (c.attrs.getInt("row_sharded", 0) && c.comm && c.comm->size() > 1)
    return sdError(op, ": OSFT with --shard params over ", c.comm->size(),
                   " ranks is not built for CUDA (the CPU backend has it); compile with --shard none, optimizer or grads");
  return Status::ok();
}

Status OsftCoefficientsKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(requireWholeRows(c, "OsftCoefficients"));
  Status st;
  const OsftPrepared *a = preparedOf(c, "OsftCoefficients", st);
  if (!a) return st;
  Pairs pairs = pairsOf(c, 0);
  float *out = c.outputs[0].as<float>();
  for (size_t i = 0; i < pairs.sides.size(); ++i) {
    const void *x = c.inputs[2 * i].data, *h = c.inputs[2 * i + 1].data;
    SD_RETURN_IF_ERROR(pairs.sides[i] == 0 ? a->gemms[i]->run(h, x, out + pairs.offsets[i], 1.0, 0.0, streamOf(c))
                                           : a->gemms[i]->run(x, h, out + pairs.offsets[i], 1.0, 0.0, streamOf(c)));
  }
  return Status::ok();
}

// OsftDeflate: x - high C (side 0) or x - C high (side 1), in place.
std::shared_ptr<const void> prepareOsftDeflate(const PrepareContext &p) {
  auto a = std::make_shared<OsftPrepared>();
  const KernelContext &c = p.kernel;
  Pairs pairs = pairsOf(c, 1);
  for (size_t i = 0; i < pairs.sides.size(); ++i) {
    const TensorView &x = c.inputs[1 + 2 * i], &h = c.inputs[2 + 2 * i];
    int64_t rows = x.dims[0], cols = x.dims[1];
    if (pairs.sides[i] == 0) a->plan(p, shapeOf(false, false, rows, cols, h.dims[1], h.dims[1], cols, cols));
    else a->plan(p, shapeOf(false, false, rows, cols, h.dims[0], h.dims[0], cols, cols));
  }
  return a;
}

Status OsftDeflateKernel(const KernelContext &c) {
  SD_RETURN_IF_ERROR(requireWholeRows(c, "OsftDeflate"));
  Status st;
  const OsftPrepared *a = preparedOf(c, "OsftDeflate", st);
  if (!a) return st;
  Pairs pairs = pairsOf(c, 1);
  const float *coef = c.inputs[0].as<float>();
  cudaStream_t s = streamOf(c);
  for (size_t i = 0; i < pairs.sides.size(); ++i) {
    const TensorView &x = c.inputs[1 + 2 * i], &h = c.inputs[2 + 2 * i], &y = c.outputs[i];
    if (y.data != x.data)
      SD_RETURN_IF_ERROR(cudaCheck(cudaMemcpyAsync(y.data, x.data, x.byteSize(), cudaMemcpyDeviceToDevice, s),
                                   "OsftDeflate"));
    SD_RETURN_IF_ERROR(pairs.sides[i] == 0 ? a->gemms[i]->run(h.data, coef + pairs.offsets[i], y.data, -1.0, 1.0, s)
                                           : a->gemms[i]->run(coef + pairs.offsets[i], h.data, y.data, -1.0, 1.0, s));
  }
  return Status::ok();
}

} // namespace

void registerOsftKernels() {
  TypeSet f32{DType::F32};
  registerKernel("OsftLinear", OsftLinearKernel, f32, prepareOsftLinear);
  registerKernel("OsftLinearGrad", OsftLinearGradKernel, f32, prepareOsftLinearGrad);
  registerKernel("OsftCompose", OsftComposeKernel, f32, prepareOsftCompose);
  registerKernel("OsftComposeGrad", OsftComposeGradKernel, f32, prepareOsftComposeGrad);
  registerKernel("OsftCoefficients", OsftCoefficientsKernel, f32, prepareOsftCoefficients);
  registerKernel("OsftDeflate", OsftDeflateKernel, f32, prepareOsftDeflate);
}

} // namespace sd::cuda
