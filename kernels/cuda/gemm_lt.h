// Row-major GEMMs through cuBLASLt. A plan for one (shape, type, layout,
// epilogue) is built when the session is created: descriptors, the
// heuristic's algorithm, pinned, and the session's one workspace, so a step
// only calls cublasLtMatmul (nothing is allocated or chosen during a step or
// a graph capture).
#pragma once
#include "cublaslt_api.h"
#include "cuda_util.cuh"
#include <memory>
#include <string>
#include <vector>

namespace sd::cuda {

// One handle and one workspace per session (kept in PrepareContext::shared).
struct LtResources {
  const LtApi *api = nullptr;
  cublasLtHandle_t handle = nullptr;
  void *workspace = nullptr;
  size_t workspaceBytes = 0;
  ~LtResources();
};

// out(m x n) = alpha * op(A)(m x k) * op(B)(k x n) + beta * out, row-major,
// `batch` times with element strides between the batch's matrices (0: shared).
struct GemmShape {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1, strideA = 0, strideB = 0, strideC = 0;
  DType dtype = DType::F32;
  const void *bias = nullptr; // a length-n vector added to every row (epilogue)
  // An epilogue past the bias (gemm_epilogue.cu; cuBLASLt's GELU is the tanh
  // form). Gelu: out = gelu(product + bias), the GELU's input kept in `aux`
  // when it is set. DGelu: out = product * gelu'(aux), and, when `biasGrad`
  // is set, out's sums over rows (length n) there.
  enum class Epilogue { None, Gelu, DGelu };
  Epilogue epilogue = Epilogue::None;
  const void *aux = nullptr; // [m, n] row-major, leading dimension ldc (a multiple of 8)
  void *biasGrad = nullptr;
  // The alignment (bytes, a power of two) every pointer the plan runs on
  // keeps: the algorithm is chosen for it (cuBLASLt assumes 256 otherwise).
  // Session buffers start at 64-byte arena offsets; callers that run on
  // offsets into them say less (alignmentOf).
  uint32_t alignBytes = 64;
};

// The largest power of two, at most 64, that divides `elements` elements of
// `dtype` in bytes: the alignment an offset of that many elements keeps.
uint32_t alignmentOf(int64_t elements, DType dtype);

struct LtGemm {
  std::shared_ptr<LtResources> res;
  GemmShape shape;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t layoutA = nullptr, layoutB = nullptr, layoutC = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // cuBLASLt could not be loaded: the built-in tiled GEMM runs instead (slower,
  // same semantics), so a machine with only the NVIDIA driver still runs plans.
  bool builtin = false;
  std::string error; // why no plan could be built; the step reports it
  ~LtGemm();
  // False where run() would take the built-in GEMM (no cuBLASLt, or pointers
  // less aligned than the plan's), which has no epilogue but the bias.
  bool runsOnLt(const void *a, const void *b, const void *c, const void *addend = nullptr) const;
  // out = alpha * product + beta * (addend when set, else out): cuBLASLt
  // reads C from `addend` and writes D to `out` (the same layout), so a sum
  // into a GEMM's result costs no copy (sd-accumulate-into-gemm).
  Status run(const void *a, const void *b, void *out, double alpha, double beta, cudaStream_t stream,
             const void *addend = nullptr) const;
  // Up to `count` algorithms cuBLASLt's heuristic offers for these
  // descriptors, its choice first; and one run with a given one (no checks:
  // sdrun bench --gemms times them all).
  std::vector<cublasLtMatmulAlgo_t> offered(int count) const;
  Status runWith(const cublasLtMatmulAlgo_t &with, const void *a, const void *b, void *out, double alpha, double beta,
                 cudaStream_t stream, const void *addend = nullptr) const;
};

// The row-major GEMM shapes of Gemm's and Linear's operands (linalg.cu).
GemmShape gemmShapeOf(const KernelContext &c);
GemmShape linearShapeOf(const KernelContext &c);

// The built-in GEMM (gemm_builtin.cu): the fallback when cuBLASLt is missing.
Status builtinGemm(const GemmShape &s, const void *a, const void *b, void *c, double alpha, double beta,
                   cudaStream_t stream);

// The plan for `shape`, or one carrying the reason there is none. Its
// algorithm is the heuristic's first, or the one a GEMM tuning file names
// for this GPU and shape (SD_GEMM_TUNING=FILE, written by `sdrun bench
// --gemms --tune FILE`; gemm_tuning.cu): fixed per file, so runs stay bit
// for bit the same.
std::shared_ptr<LtGemm> planGemm(const PrepareContext &p, const GemmShape &shape);

// A shape's line key in a tuning file, and the index (into the heuristic's
// list) the process's SD_GEMM_TUNING file names for it on this GPU, else -1.
std::string tuningKey(const GemmShape &shape);
int tunedAlgorithm(const GemmShape &shape);
std::string currentGpuName();

} // namespace sd::cuda
