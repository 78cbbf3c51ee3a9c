// CPU kernels of orthogonal subspace fine-tuning (sd-peft-osft). Every
// product is a GEMM on the factors: W [out, in] is formed only by
// OsftCompose, the dense strategy the compiler picks when one GEMM on W is
// cheaper than the factored chain. The projections work in factored form,
// x - high (high^T x) and x - (x high^T) high, never through an out x out or
// in x in matrix.
#include "cpu_util.h"
#include "gemm.h"
#include "sd/format/row_shard.h"
#include "sd/ops/communicator.h"
#include <cstring>
#include <functional>
#include <vector>

namespace sd::cpu {
namespace {

// Row-major GEMM on the session's threads: C[m,n] = alpha op(A) op(B) + beta C.
void mm(const KernelContext &c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
        int64_t lda, const float *b, int64_t ldb, float beta, float *out, int64_t ldc) {
  sgemmOnPool(c.pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc);
}

void scaleColumns(float *a, int64_t rows, int64_t cols, const float *s) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) a[i * cols + j] *= s[j];
}

struct Factors {
  const float *u, *s, *v;
  int64_t k;
};

Factors factorsAt(const KernelContext &c, size_t first) {
  return {c.inputs[first].as<float>(), c.inputs[first + 1].as<float>(), c.inputs[first + 2].as<float>(),
          c.inputs[first + 1].dims[0]};
}

// y (+)= ((x V^T) diag(S)) U^T for one half.
void addHalf(const KernelContext &c, const Factors &f, const float *x, int64_t rows, int64_t in, int64_t out,
             float beta, float *y) {
  std::vector<float> a(size_t(rows * f.k));
  mm(c, false, true, rows, f.k, in, 1.0f, x, in, f.v, in, 0.0f, a.data(), f.k);
  scaleColumns(a.data(), rows, f.k, f.s);
  mm(c, false, true, rows, out, f.k, 1.0f, a.data(), f.k, f.u, f.k, beta, y, out);
}

// x, U_high, S_high, V_high, U_low, S_low, V_low, bias? -> y.
Status OsftLinearKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  int64_t in = x.dims.back(), out = y.dims.back(), rows = x.numElements() / std::max<int64_t>(in, 1);
  float *yp = y.as<float>();
  bool bias = c.hasInput(7) && c.inputs[7].data;
  float beta = 0.0f;
  if (bias) {
    const float *b = c.inputs[7].as<float>();
    for (int64_t i = 0; i < rows; ++i) std::memcpy(yp + i * out, b, size_t(out) * sizeof(float));
    beta = 1.0f;
  }
  addHalf(c, factorsAt(c, 1), x.as<float>(), rows, in, out, beta, yp);
  addHalf(c, factorsAt(c, 4), x.as<float>(), rows, in, out, 1.0f, yp); // accumulates: no separate add
  return Status::ok();
}

// dy, x, U_high, S_high, V_high, U_low, S_low, V_low -> dx, dU_low, dS_low, dV_low.
Status OsftLinearGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &x = c.inputs[1];
  int64_t in = x.dims.back(), out = dy.dims.back(), rows = x.numElements() / std::max<int64_t>(in, 1);
  Factors hi = factorsAt(c, 2), lo = factorsAt(c, 5);
  int64_t r = lo.k;
  const float *dyp = dy.as<float>(), *xp = x.as<float>();
  std::vector<float> g(size_t(rows * r)), a(size_t(rows * r));
  mm(c, false, false, rows, r, out, 1.0f, dyp, out, lo.u, r, 0.0f, g.data(), r); // g = dy U_low
  mm(c, false, true, rows, r, in, 1.0f, xp, in, lo.v, in, 0.0f, a.data(), r);    // a = x V_low^T
  float *ds = c.outputs[2].as<float>();
  std::vector<double> acc(size_t(r), 0.0);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < r; ++j) acc[size_t(j)] += double(g[size_t(t * r + j)]) * double(a[size_t(t * r + j)]);
  for (int64_t j = 0; j < r; ++j) ds[j] = float(acc[size_t(j)]);
  scaleColumns(a.data(), rows, r, lo.s);
  scaleColumns(g.data(), rows, r, lo.s);
  mm(c, true, false, out, r, rows, 1.0f, dyp, out, a.data(), r, 0.0f, c.outputs[1].as<float>(), r); // dU = dy^T a S
  mm(c, true, false, r, in, rows, 1.0f, g.data(), r, xp, in, 0.0f, c.outputs[3].as<float>(), in);  // dV = S g^T x
  if (c.attrs.getInt("input_grad", 1)) {
    std::vector<float> gh(size_t(rows * hi.k));
    mm(c, false, false, rows, hi.k, out, 1.0f, dyp, out, hi.u, hi.k, 0.0f, gh.data(), hi.k);
    scaleColumns(gh.data(), rows, hi.k, hi.s);
    float *dx = c.outputs[0].as<float>();
    mm(c, false, false, rows, in, hi.k, 1.0f, gh.data(), hi.k, hi.v, in, 0.0f, dx, in);
    mm(c, false, false, rows, in, r, 1.0f, g.data(), r, lo.v, in, 1.0f, dx, in);
  }
  return Status::ok();
}

// U_high, S_high, V_high, U_low, S_low, V_low -> W [out, in].
Status OsftComposeKernel(const KernelContext &c) {
  const TensorView &w = c.outputs[0];
  int64_t out = w.dims[0], in = w.dims[1];
  float beta = 0.0f;
  for (size_t first : {size_t(0), size_t(3)}) {
    Factors f = factorsAt(c, first);
    std::vector<float> us(f.u, f.u + out * f.k);
    scaleColumns(us.data(), out, f.k, f.s);
    mm(c, false, false, out, in, f.k, 1.0f, us.data(), f.k, f.v, in, beta, w.as<float>(), in);
    beta = 1.0f;
  }
  return Status::ok();
}

// dW, U_low, S_low, V_low -> dU_low = dW V^T S, dS_low = diag(U^T dW V^T), dV_low = S U^T dW.
Status OsftComposeGradKernel(const KernelContext &c) {
  const float *dw = c.inputs[0].as<float>();
  Factors lo = factorsAt(c, 1);
  int64_t out = c.inputs[0].dims[0], in = c.inputs[0].dims[1], r = lo.k;
  float *du = c.outputs[0].as<float>(), *ds = c.outputs[1].as<float>(), *dv = c.outputs[2].as<float>();
  mm(c, false, true, out, r, in, 1.0f, dw, in, lo.v, in, 0.0f, du, r); // P = dW V^T
  std::vector<double> acc(size_t(r), 0.0);
  for (int64_t n = 0; n < out; ++n)
    for (int64_t j = 0; j < r; ++j) acc[size_t(j)] += double(lo.u[n * r + j]) * double(du[n * r + j]);
  for (int64_t j = 0; j < r; ++j) ds[j] = float(acc[size_t(j)]);
  scaleColumns(du, out, r, lo.s);
  mm(c, true, false, r, in, out, 1.0f, lo.u, r, dw, in, 0.0f, dv, in); // U^T dW
  for (int64_t j = 0; j < r; ++j)
    for (int64_t i = 0; i < in; ++i) dv[j * in + i] *= lo.s[j];
  return Status::ok();
}

// Runs pair(p, pool) for every (x, high) pair. The products are small (rank
// x rank over one dimension of W), so with several pairs the threads take
// whole pairs rather than splitting each product.
void forEachPair(const KernelContext &c, size_t pairs, const std::function<void(size_t, ThreadPool *)> &pair) {
  if (!c.pool || c.pool->size() <= 1 || pairs < size_t(2 * c.pool->size())) {
    for (size_t p = 0; p < pairs; ++p) pair(p, c.pool);
    return;
  }
  c.pool->parallelFor(int64_t(pairs), 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) pair(size_t(p), nullptr);
  });
}

// How the shared coefficient buffer is laid out: where each pair starts, and
// for a V pair its block [r, k] of the whole factors. Under --shard params
// (row_sharded) x holds this rank's rows only, and a V pair's high may too:
// the layout follows the whole tensors (attributes x_rows, high_rows), the
// same on every rank, so that one all-reduce of the buffer completes it.
struct PairLayout {
  std::vector<int64_t> sides, offsets, xRows, highRows;
  int rank = 0, ranks = 1;
  // This rank's rows of pair p's x (all of them when not sharded).
  RowBlock rows(size_t p) const { return rowBlock(xRows[p], rank, ranks); }
};

StatusOr<PairLayout> pairLayout(const KernelContext &c, size_t first) {
  PairLayout l;
  l.sides = c.attrs.getInts("sides");
  const size_t pairs = l.sides.size();
  if (c.attrs.getInt("row_sharded", 0)) {
    l.xRows = c.attrs.getInts("x_rows"), l.highRows = c.attrs.getInts("high_rows");
    SD_CHECK_ARG(l.xRows.size() == pairs && l.highRows.size() == pairs, "row_sharded needs x_rows and high_rows per pair");
    if (c.comm) l.rank = c.comm->rank(), l.ranks = c.comm->size();
  } else {
    for (size_t p = 0; p < pairs; ++p) {
      l.xRows.push_back(c.inputs[first + 2 * p].dims[0]);
      l.highRows.push_back(c.inputs[first + 2 * p + 1].dims[0]);
    }
  }
  l.offsets.assign(pairs + 1, 0);
  for (size_t p = 0; p < pairs; ++p) {
    const TensorView &x = c.inputs[first + 2 * p], &h = c.inputs[first + 2 * p + 1];
    SD_CHECK_ARG(x.dims[0] == l.rows(p).count, "OSFT projection: pair ", p, " holds ", x.dims[0], " rows of x, this rank's are ",
                 l.rows(p).count);
    l.offsets[p + 1] = l.offsets[p] + (l.sides[p] == 0 ? h.dims[1] * x.dims[1] : l.xRows[p] * l.highRows[p]);
  }
  return l;
}

// (x, high) pairs -> their coefficients, one after another: side 0 high^T x
// [k, r], side 1 x high^T [r, k]. Sharded, a U pair's product over this
// rank's rows is a partial sum, and a V pair's rows are this rank's rows of
// x, placed at their rows of the block with zeros elsewhere: the sum over the
// ranks (one AllReduce step after this one) is the whole buffer.
Status OsftCoefficientsKernel(const KernelContext &c) {
  auto layout = pairLayout(c, 0);
  if (!layout.isOk()) return layout.status();
  const PairLayout &l = layout.value();
  float *out = c.outputs[0].as<float>();
  if (l.ranks > 1) std::memset(out, 0, c.outputs[0].byteSize());
  forEachPair(c, l.sides.size(), [&](size_t p, ThreadPool *pool) {
    const TensorView &x = c.inputs[2 * p], &h = c.inputs[2 * p + 1];
    KernelContext one{c.attrs, {}, {}, pool};
    if (x.dims[0] == 0) return; // no rows here: zeros
    if (l.sides[p] == 0) {
      int64_t n = x.dims[0], r = x.dims[1], k = h.dims[1];
      mm(one, true, false, k, r, n, 1.0f, h.as<float>(), k, x.as<float>(), r, 0.0f, out + l.offsets[p], r);
    } else {
      int64_t r = x.dims[0], m = x.dims[1], k = h.dims[0];
      mm(one, false, true, r, k, m, 1.0f, x.as<float>(), m, h.as<float>(), m, 0.0f,
         out + l.offsets[p] + l.rows(p).begin * l.highRows[p], l.highRows[p]);
    }
  });
  return Status::ok();
}

// coefficients, (x, high) pairs -> each x - high C (side 0) or x - C high (side 1).
Status OsftDeflateKernel(const KernelContext &c) {
  auto layout = pairLayout(c, 1);
  if (!layout.isOk()) return layout.status();
  const PairLayout &l = layout.value();
  const float *coef = c.inputs[0].as<float>();
  forEachPair(c, l.sides.size(), [&](size_t p, ThreadPool *pool) {
    const TensorView &x = c.inputs[1 + 2 * p], &h = c.inputs[2 + 2 * p], &y = c.outputs[p];
    KernelContext one{c.attrs, {}, {}, pool};
    if (y.data != x.data) std::memcpy(y.data, x.data, x.byteSize());
    int64_t rows = x.dims[0], cols = x.dims[1];
    if (rows == 0) return;
    if (l.sides[p] == 0) {
      int64_t k = h.dims[1];
      mm(one, false, false, rows, cols, k, -1.0f, h.as<float>(), k, coef + l.offsets[p], cols, 1.0f, y.as<float>(), cols);
    } else {
      int64_t k = h.dims[0];
      mm(one, false, false, rows, cols, k, -1.0f, coef + l.offsets[p] + l.rows(p).begin * l.highRows[p], l.highRows[p],
         h.as<float>(), cols, 1.0f, y.as<float>(), cols);
    }
  });
  return Status::ok();
}

} // namespace

void registerOsftKernels() {
  registerCpuKernel("OsftLinear", OsftLinearKernel, {DType::F32});
  registerCpuKernel("OsftLinearGrad", OsftLinearGradKernel, {DType::F32});
  registerCpuKernel("OsftCompose", OsftComposeKernel, {DType::F32});
  registerCpuKernel("OsftComposeGrad", OsftComposeGradKernel, {DType::F32});
  registerCpuKernel("OsftCoefficients", OsftCoefficientsKernel, {DType::F32});
  registerCpuKernel("OsftDeflate", OsftDeflateKernel, {DType::F32});
}

} // namespace sd::cpu
