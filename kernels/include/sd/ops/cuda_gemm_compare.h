// Our GEMMs against raw cuBLASLt on the same shapes (CUDA builds only:
// kernels/cuda/gemm_compare.cu; `sdrun bench --gemms`). For each distinct
// GEMM among `steps` (Linear, Gemm, LinearGelu, GemmDGelu: the product alone,
// with Linear's bias), the plan a session builds (the heuristic's first
// algorithm, pinned) and every algorithm cuBLASLt's heuristic offers for the
// same descriptors are timed on fresh device buffers with CUDA events, each
// the median of `iterations` runs. The fastest one's index and the shape's
// key make a GEMM tuning file's line (`sdrun bench --gemms --tune FILE`).
#pragma once
#include "sd/ops/attrs.h"
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include <string>
#include <vector>

namespace sd::cuda {

struct GemmStep {
  std::string op;
  const AttrMap *attrs = nullptr;
  std::vector<TensorView> inputs, outputs; // dtype and dims; data unused (absent operand: Undefined)
};

struct GemmTiming {
  std::string op; // the first step with this shape
  int64_t m = 0, n = 0, k = 0;
  bool transA = false, transB = false, bias = false;
  DType dtype = DType::F32;
  int steps = 0;         // how many of `steps` run this shape
  double oursMs = -1, bestMs = -1;
  int algorithms = 0;    // how many cuBLASLt offered
  int bestIndex = -1;    // the fastest one's place in the heuristic's list
  std::string tuningKey; // the shape's key in a GEMM tuning file (SD_GEMM_TUNING)
};

// The GPU's name in `device`; an error when there is no usable GPU or cuBLASLt.
StatusOr<std::vector<GemmTiming>> compareGemmsWithCublasLt(const std::vector<GemmStep> &steps, int iterations,
                                                           int algorithms, std::string &device);

} // namespace sd::cuda
