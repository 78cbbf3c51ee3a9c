// cuBLASLt plans (see gemm_lt.h). Row-major products run as the
// column-major product of the transposes: out^T = op(B)^T * op(A)^T.
#include "gemm_lt.h"
#include <cstdio>
#include <vector>

namespace sd::cuda {

// 32 MiB, the workspace NVIDIA recommends for Hopper; smaller GPUs use less.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

LtResources::~LtResources() {
  if (workspace) cudaFree(workspace);
  if (handle) api->destroy(handle);
}

LtGemm::~LtGemm() {
  if (!res) return;
  const LtApi &lt = *res->api;
  if (layoutA) lt.layoutDestroy(layoutA);
  if (layoutB) lt.layoutDestroy(layoutB);
  if (layoutC) lt.layoutDestroy(layoutC);
  if (op) lt.descDestroy(op);
}

static std::shared_ptr<LtResources> resources(const PrepareContext &p, std::string &error) {
  std::shared_ptr<const void> &slot = p.shared["cuda.cublaslt"];
  if (slot) return std::const_pointer_cast<LtResources>(std::static_pointer_cast<const LtResources>(slot));
  const LtApi *api = cublasLt(error);
  if (!api) return nullptr;
  auto r = std::make_shared<LtResources>();
  r->api = api;
  if (api->create(&r->handle) != CUBLAS_STATUS_SUCCESS) {
    error = "cuBLASLt could not be initialized";
    return nullptr;
  }
  if (cudaMalloc(&r->workspace, kWorkspaceBytes) != cudaSuccess) {
    cudaGetLastError();
    error = "cannot allocate cuBLASLt's 32 MiB workspace";
    return nullptr;
  }
  r->workspaceBytes = kWorkspaceBytes;
  slot = r;
  return r;
}

static bool ltType(DType t, cudaDataType_t &data, cublasComputeType_t &compute, cudaDataType_t &scale) {
  switch (t) {
  // CUBLAS_COMPUTE_32F never uses TF32: f32 plans match the CPU's f32 products.
  case DType::F32: data = CUDA_R_32F; compute = CUBLAS_COMPUTE_32F; scale = CUDA_R_32F; return true;
  case DType::F16: data = CUDA_R_16F; compute = CUBLAS_COMPUTE_32F; scale = CUDA_R_32F; return true;
  case DType::BF16: data = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; scale = CUDA_R_32F; return true;
  case DType::F64: data = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; scale = CUDA_R_64F; return true;
  default: return false;
  }
}

static bool setBatch(const LtApi &lt, cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch <= 1) return true;
  int32_t count = int32_t(batch);
  return lt.layoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count) ==
             CUBLAS_STATUS_SUCCESS &&
         lt.layoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride) ==
             CUBLAS_STATUS_SUCCESS;
}

uint32_t alignmentOf(int64_t elements, DType dtype) {
  uint64_t bytes = uint64_t(elements) * dtypeSize(dtype);
  uint32_t a = 64;
  while (a > 1 && bytes % a) a /= 2;
  return a;
}

std::shared_ptr<LtGemm> planGemm(const PrepareContext &p, const GemmShape &shape) {
  auto g = std::make_shared<LtGemm>();
  GemmShape s = shape;
  if (s.batch > 1) // each matrix of a strided batch starts at its stride's alignment
    for (int64_t stride : {s.strideA, s.strideB, s.strideC})
      if (stride) s.alignBytes = std::min(s.alignBytes, alignmentOf(stride, s.dtype));
  g->shape = s;
  g->res = resources(p, g->error);
  if (!g->res) {
    std::string why;
    if (!cublasLt(why)) { // no library at all: the built-in kernel, said once per process
      static bool said = false;
      if (!said) std::fprintf(stderr, "sdrun: %s; using the built-in GEMM (slower)\n", why.c_str());
      said = true;
      g->builtin = true;
      g->error.clear();
    }
    return g;
  }
  const LtApi &lt = *g->res->api;
  cudaDataType_t data, scale;
  cublasComputeType_t compute;
  if (!ltType(s.dtype, data, compute, scale)) {
    g->error = std::string("cuBLASLt plans do not take ") + dtypeName(s.dtype);
    return g;
  }
  if (s.batch > INT32_MAX) {
    g->error = "batch too large for cuBLASLt";
    return g;
  }
  // Column-major: D (n x m) = X (n x k) * Y (k x m) with X from B and Y from A.
  cublasOperation_t opX = s.transB ? CUBLAS_OP_T : CUBLAS_OP_N, opY = s.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  bool ok = lt.descCreate(&g->op, compute, scale) == CUBLAS_STATUS_SUCCESS &&
            lt.descSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opX, sizeof opX) ==
                CUBLAS_STATUS_SUCCESS &&
            lt.descSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opY, sizeof opY) ==
                CUBLAS_STATUS_SUCCESS;
  if (ok && (s.bias || s.epilogue != GemmShape::Epilogue::None)) {
    auto set = [&](cublasLtMatmulDescAttributes_t attr, const void *value, size_t bytes) {
      return lt.descSetAttribute(g->op, attr, value, bytes) == CUBLAS_STATUS_SUCCESS;
    };
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    if (s.epilogue == GemmShape::Epilogue::Gelu)
      epi = s.aux ? (s.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                  : (s.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
    else if (s.epilogue == GemmShape::Epilogue::DGelu)
      epi = s.biasGrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    ok = set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    // The bias in, or (DGELU_BGRAD) the bias gradient out, through the same pointer.
    const void *biasPointer = s.epilogue == GemmShape::Epilogue::DGelu ? s.biasGrad : s.bias;
    if (ok && biasPointer) ok = set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &biasPointer, sizeof biasPointer);
    if (ok && s.aux) {
      int64_t ld = s.ldc;
      ok = set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &s.aux, sizeof s.aux) &&
           set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    }
  }
  auto layout = [&](cublasLtMatrixLayout_t *l, bool trans, int64_t rows, int64_t cols, int64_t ld) {
    return lt.layoutCreate(l, data, uint64_t(trans ? cols : rows), uint64_t(trans ? rows : cols), ld) ==
           CUBLAS_STATUS_SUCCESS;
  };
  ok = ok && layout(&g->layoutB, s.transB, s.n, s.k, s.ldb) && setBatch(lt, g->layoutB, s.batch, s.strideB) &&
       layout(&g->layoutA, s.transA, s.k, s.m, s.lda) && setBatch(lt, g->layoutA, s.batch, s.strideA) &&
       layout(&g->layoutC, false, s.n, s.m, s.ldc) && setBatch(lt, g->layoutC, s.batch, s.strideC);
  if (!ok) {
    g->error = "cuBLASLt refused the GEMM's descriptors";
    return g;
  }
  std::vector<cublasLtMatmulAlgo_t> offered = g->offered(1);
  if (offered.empty()) {
    g->error = "cuBLASLt has no algorithm for " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
               std::to_string(s.k) + " " + dtypeName(s.dtype);
    return g;
  }
  g->algo = offered[0];
  // A tuning file's choice: the index-th algorithm of the same heuristic list.
  if (int index = tunedAlgorithm(s); index > 0) {
    std::vector<cublasLtMatmulAlgo_t> more = g->offered(index + 1);
    if (more.size() > size_t(index)) g->algo = more[size_t(index)];
  }
  return g;
}

std::vector<cublasLtMatmulAlgo_t> LtGemm::offered(int count) const {
  const LtApi &lt = *res->api;
  std::vector<cublasLtMatmulHeuristicResult_t> results(size_t(std::max(count, 1)));
  int found = 0;
  cublasLtMatmulPreference_t pref = nullptr;
  if (lt.preferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
    size_t ws = res->workspaceBytes;
    lt.preferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (cublasLtMatmulPreferenceAttributes_t a :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      lt.preferenceSetAttribute(pref, a, &shape.alignBytes, sizeof shape.alignBytes);
    if (lt.algoGetHeuristic(res->handle, op, layoutB, layoutA, layoutC, layoutC, pref, int(results.size()),
                            results.data(), &found) != CUBLAS_STATUS_SUCCESS)
      found = 0;
    lt.preferenceDestroy(pref);
  }
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i)
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[size_t(i)].algo);
  return algos;
}

bool LtGemm::runsOnLt(const void *a, const void *b, const void *c, const void *addend) const {
  auto aligned = [&](const void *ptr) { return reinterpret_cast<uintptr_t>(ptr) % shape.alignBytes == 0; };
  return error.empty() && !builtin && aligned(a) && aligned(b) && aligned(c) && (!addend || aligned(addend));
}

Status LtGemm::run(const void *a, const void *b, void *out, double alpha, double beta, cudaStream_t stream,
                   const void *addend) const {
  if (!error.empty()) return sdError(error);
  // A pointer less aligned than the algorithm was chosen for: the built-in
  // GEMM (same result semantics) rather than a failed or faulting call. It
  // has no GELU epilogues: their callers check runsOnLt first.
  if (!runsOnLt(a, b, out, addend)) {
    if (shape.epilogue != GemmShape::Epilogue::None) return sdError("a GELU epilogue GEMM cannot run on the built-in GEMM");
    if (addend && addend != out && beta != 0.0) { // the built-in GEMM accumulates in place
      int64_t elements = shape.batch > 1 ? shape.strideC * shape.batch : shape.m * shape.ldc;
      size_t bytes = size_t(elements) * dtypeSize(shape.dtype);
      SD_RETURN_IF_ERROR(cudaCheck(cudaMemcpyAsync(out, addend, bytes, cudaMemcpyDeviceToDevice, stream), "GEMM addend"));
    }
    return builtinGemm(shape, a, b, out, alpha, beta, stream);
  }
  return runWith(algo, a, b, out, alpha, beta, stream, addend);
}

Status LtGemm::runWith(const cublasLtMatmulAlgo_t &with, const void *a, const void *b, void *out, double alpha,
                       double beta, cudaStream_t stream, const void *addend) const {
  float af = float(alpha), bf = float(beta);
  const void *pa = shape.dtype == DType::F64 ? static_cast<const void *>(&alpha) : &af;
  const void *pb = shape.dtype == DType::F64 ? static_cast<const void *>(&beta) : &bf;
  const LtApi &lt = *res->api;
  const void *c = addend ? addend : out;
  cublasStatus_t st = lt.matmul(res->handle, op, pa, b, layoutB, a, layoutA, pb, c, layoutC, out, layoutC, &with,
                                res->workspace, res->workspaceBytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS) return sdError("cublasLtMatmul failed: ", lt.statusString(st));
  return Status::ok();
}

} // namespace sd::cuda
