// cuBLASLt, loaded when the first GEMM plan is built rather than linked: the
// library is several hundred MiB, and a build with the CUDA backend must still
// start (and run on the CPU) on machines without it, or under a tight
// address-space limit.
#pragma once
#include <cublasLt.h>
#include <string>

namespace sd::cuda {

struct LtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtMatmulDescCreate) descCreate;
  decltype(&cublasLtMatmulDescDestroy) descDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) descSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) layoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) layoutDestroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) layoutSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) preferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) preferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) algoGetHeuristic;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtGetStatusString) statusString;
};

// The loaded API, or null with `error` saying which library could not be loaded and why.
const LtApi *cublasLt(std::string &error);

} // namespace sd::cuda
