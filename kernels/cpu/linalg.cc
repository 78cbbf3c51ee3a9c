// CPU kernels for MatMul, Gemm, Linear and Det: f32 products go to the
// feature-dispatched GEMM (sgemm.h), with a constant right operand packed once
// when the session is created; other types use gemm.h's fallbacks.
#include "cpu_util.h"
#include "gemm.h"
#include "sd/ops/cpu_info.h"
#include "sgemm.h"
#include "sd/ops/math/determinant.h"
#include <cblas.h>
#include <cstdlib>
#include <string_view>
#include <string>
#include <type_traits>
#include <vector>
#include <cmath>

namespace sd::cpu {
namespace {

// The step's product with B = inputs[1]; f32 uses B's packed copy when the
// session prepared one (see packConstantB).
template <typename T>
void gemmWithB(const KernelContext &c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T *a,
               int64_t lda, const T *b, int64_t ldb, T beta, T *out, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    sgemm(c.pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc, static_cast<const PackedB *>(c.prepared));
  } else {
    parallelGemm<T>(c.pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc);
  }
}

// Weights are constants of a plan: a frozen f32 B (k x n after op) is packed
// into the GEMM's panel layout once per session, shared by every step and
// entry that multiplies by it the same way. Trainable weights change every
// optimizer step and are read unpacked: in bench/gemm a prepacked B was
// within -7..+2% of per-call packing on the demo GPT's shapes and up to +20%
// at d=512, which repacking after every optimizer step would give back.
std::shared_ptr<const void> packConstantB(const PrepareContext &p, bool tb, int64_t k, int64_t n, int64_t ldb) {
  const TensorView &b = p.kernel.inputs[1];
  if (b.dtype != DType::F32 || !b.data || p.constantInputs.size() < 2 || !p.constantInputs[1]) return nullptr;
  std::string key = "sgemm.packB:" + std::to_string(reinterpret_cast<uintptr_t>(b.data)) + (tb ? ":t:" : ":n:") +
                    std::to_string(k) + "x" + std::to_string(n) + ":" + std::to_string(ldb);
  std::shared_ptr<const void> &slot = p.shared[key];
  if (!slot) {
    auto packed = std::make_shared<PackedB>(packB(tb, k, n, b.as<float>(), ldb));
    if (!packed->data) return nullptr; // out of memory: the kernel reads B unpacked
    slot = packed;
  }
  if (p.superseded) (*p.superseded)[1] = true; // every product by it reads the packed copy
  return slot;
}

std::shared_ptr<const void> prepareMatMul(const PrepareContext &p) {
  const TensorView &b = p.kernel.inputs[1];
  // Only a B shared by the whole batch folds into one GEMM with a packed B.
  if (b.dims.size() < 2 || product(b.dims) != b.dims[b.dims.size() - 2] * b.dims.back()) return nullptr;
  return packConstantB(p, false, b.dims[b.dims.size() - 2], b.dims.back(), b.dims.back());
}

std::shared_ptr<const void> prepareGemm(const PrepareContext &p) {
  const TensorView &b = p.kernel.inputs[1];
  bool tb = p.kernel.attrs.getInt("transB", 0);
  if (b.dims.size() != 2) return nullptr;
  return packConstantB(p, tb, tb ? b.dims[1] : b.dims[0], tb ? b.dims[0] : b.dims[1], b.dims[1]);
}

std::shared_ptr<const void> prepareLinear(const PrepareContext &p) {
  const TensorView &w = p.kernel.inputs[1];
  bool oi = p.kernel.attrs.getString("layout", "io") == "oi";
  if (w.dims.size() != 2) return nullptr;
  return packConstantB(p, oi, oi ? w.dims[1] : w.dims[0], oi ? w.dims[0] : w.dims[1], w.dims[1]);
}

Status MatMulKernel(const KernelContext &c) {
  const TensorView &a = c.inputs[0], &b = c.inputs[1], &o = c.outputs[0];
  Dims ad = a.dims, bd = b.dims;
  if (ad.size() == 1) ad.insert(ad.begin(), 1);
  if (bd.size() == 1) bd.push_back(1);
  int64_t m = ad[ad.size() - 2], k = ad.back(), n = bd.back();
  SD_CHECK_ARG(bd[bd.size() - 2] == k, "MatMul inner dimensions differ");
  Dims batchA(ad.begin(), ad.end() - 2), batchB(bd.begin(), bd.end() - 2);
  size_t br = std::max(batchA.size(), batchB.size());
  Dims batch(br, 1);
  for (size_t i = 0; i < br; ++i) {
    int64_t x = i + batchA.size() >= br ? batchA[i + batchA.size() - br] : 1;
    int64_t y = i + batchB.size() >= br ? batchB[i + batchB.size() - br] : 1;
    batch[i] = std::max(x, y);
  }
  SD_CHECK_ARG(product(batch) * m * n == o.numElements(), "MatMul output size mismatch");
  Dims sa = broadcastStrides(batchA, batch), sb = broadcastStrides(batchB, batch);
  int64_t nb = product(batch);
  return dispatchNumeric(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    // A batch whose B is shared and A is contiguous folds into one big GEMM.
    bool bShared = product(batchB) == 1;
    if (bShared && product(batchA) == nb) {
      gemmWithB<T>(c, false, false, nb * m, n, k, T(1), a.as<T>(), k, b.as<T>(), n, T(0), o.as<T>(), n);
      return Status::ok();
    }
    parallelFor(c.pool, nb, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t rem = i, offA = 0, offB = 0;
      for (int64_t d = int64_t(br) - 1; d >= 0; --d) {
        int64_t idx = rem % batch[size_t(d)];
        rem /= batch[size_t(d)];
        offA += idx * sa[size_t(d)];
        offB += idx * sb[size_t(d)];
      }
      gemm<T>(false, false, m, n, k, T(1), a.as<T>() + offA * m * k, k, b.as<T>() + offB * k * n,
              n, T(0), o.as<T>() + i * m * n, n);
    }
    });
    return Status::ok();
  });
}

// Writes bias broadcast into out (rows x cols) so the GEMM can accumulate
// with beta; with `addend` (rows x cols), their sum, in one pass. Rows in
// parallel: sd-accumulate-into-gemm's sums go through here (a Gemm's C of
// the output's shape, LinearAdd's addend) where a threaded Add ran before.
template <typename T>
void fillBias(ThreadPool *pool, const TensorView &bias, T *out, int64_t rows, int64_t cols,
              const T *addend = nullptr) {
  const T *b = bias.as<T>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  if (bias.numElements() == rows * cols && !addend) { // a C of the output's own shape
    if (b != out)
      parallelFor(pool, rows, grain, [&](int64_t i0, int64_t i1) {
        std::memcpy(out + i0 * cols, b + i0 * cols, size_t((i1 - i0) * cols) * sizeof(T));
      });
    return;
  }
  if (bias.numElements() == cols) { // the usual per-column bias
    parallelFor(pool, rows, grain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        if (!addend) {
          std::memcpy(out + i * cols, b, size_t(cols) * sizeof(T));
          continue;
        }
        const T *x = addend + i * cols;
        T *o = out + i * cols;
        for (int64_t j = 0; j < cols; ++j) o[j] = T(x[j] + b[j]);
      }
    });
    return;
  }
  Dims od = {rows, cols};
  Dims st = broadcastStrides(bias.dims, od);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      T v = b[i * st[0] + j * st[1]];
      out[i * cols + j] = addend ? T(addend[i * cols + j] + v) : v;
    }
}

Status GemmKernel(const KernelContext &c) {
  const TensorView &a = c.inputs[0], &b = c.inputs[1], &o = c.outputs[0];
  bool ta = c.attrs.getInt("transA", 0), tb = c.attrs.getInt("transB", 0);
  double alpha = c.attrs.getFloat("alpha", 1.0), beta = c.attrs.getFloat("beta", 1.0);
  int64_t m = o.dims[0], n = o.dims[1], k = ta ? a.dims[0] : a.dims[1];
  SD_CHECK_ARG((tb ? b.dims[1] : b.dims[0]) == k, "Gemm inner dimensions differ");
  return dispatchNumeric(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    bool hasBias = c.hasInput(2) && c.inputs[2].data && beta != 0.0;
    if (hasBias) fillBias<T>(c.pool, c.inputs[2], o.as<T>(), m, n);
    gemmWithB<T>(c, ta, tb, m, n, k, T(alpha), a.as<T>(), a.dims[1], b.as<T>(), b.dims[1], hasBias ? T(beta) : T(0),
                 o.as<T>(), n);
    return Status::ok();
  });
}

// Det of [..., M, M] by LU with partial pivoting, in double (sd/ops/math/determinant.h, shared with CUDA).
Status DetKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t m = x.dims.back(), batch = c.outputs[0].numElements();
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<double> a(size_t(m * m));
    for (int64_t b = 0; b < batch; ++b) {
      const T *src = x.as<T>() + b * m * m;
      for (int64_t i = 0; i < m * m; ++i) a[size_t(i)] = double(src[i]);
      const double det = math::luDeterminant(a.data(), m);
      c.outputs[0].as<T>()[b] = T(det);
    }
    return Status::ok();
  });
}

// Linear, and LinearAdd (inputs[3], the output's shape, summed in: the
// GEMM accumulates onto it, where Linear + Add would write the product and
// read it back).
Status LinearKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &w = c.inputs[1], &o = c.outputs[0];
  bool oi = c.attrs.getString("layout", "io") == "oi";
  int64_t k = x.dims.back(), n = o.dims.back(), m = x.numElements() / std::max<int64_t>(k, 1);
  if (k == 0) m = o.numElements() / std::max<int64_t>(n, 1);
  SD_CHECK_ARG(w.dims.size() == 2 && (oi ? w.dims[1] : w.dims[0]) == k, "linear weight does not match input");
  const TensorView *addend = c.hasInput(3) ? &c.inputs[3] : nullptr;
  SD_CHECK_ARG(!addend || (addend->numElements() == o.numElements() && addend->dtype == o.dtype),
               "LinearAdd's addend must have the output's shape and type");
  return dispatchNumeric(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    bool hasBias = c.hasInput(2) && c.inputs[2].data;
    if (hasBias) fillBias<T>(c.pool, c.inputs[2], o.as<T>(), m, n, addend ? addend->as<T>() : nullptr);
    else if (addend) fillBias<T>(c.pool, *addend, o.as<T>(), m, n);
    bool accumulate = hasBias || addend;
    gemmWithB<T>(c, false, oi, m, n, k, T(1), x.as<T>(), k, w.as<T>(), w.dims[1], accumulate ? T(1) : T(0),
                 o.as<T>(), n);
    return Status::ok();
  });
}

} // namespace

void registerLinalgKernels() {
  registerCpuKernel("MatMul", MatMulKernel, TypeSet::numeric(), prepareMatMul);
  registerCpuKernel("Gemm", GemmKernel, TypeSet::numeric(), prepareGemm);
  registerCpuKernel("Linear", LinearKernel, TypeSet::numeric(), prepareLinear);
  registerCpuKernel("LinearAdd", LinearKernel, TypeSet::numeric(), prepareLinear);
  registerCpuKernel("Det", DetKernel, TypeSet::floats());
}

} // namespace sd::cpu

namespace sd {
// OpenBLAS runs single-threaded; GEMMs are split across the session's pool
// (parallelGemm). Two thread pools on the same cores preempt each other:
// OpenBLAS's idle workers spin in sched_yield while ours need the cores.
//
// When OpenBLAS computes GEMMs (CPUs without AVX2+FMA, or SD_CPU_ISA=generic),
// its first call mallocs a 128 MiB work buffer and, if that fails (a memory
// limit), retries forever. So the session checks that much memory is there
// first, and fails with an error instead of hanging.
Status configureCpuBackend(int) {
  openblas_set_num_threads(1);
  if (std::string_view(cpu::sgemmIsa()) != "generic") return Status::ok();
  constexpr size_t kOpenBlasBuffer = (size_t(128) << 20) + (64 << 10);
  void *probe = std::malloc(kOpenBlasBuffer);
  if (!probe) return sdError("not enough memory for the BLAS work buffer (128 MiB; is ulimit -v set?)");
  std::free(probe);
  return Status::ok();
}
const char *f64GemmKernel() { return openblas_get_corename(); }
} // namespace sd
