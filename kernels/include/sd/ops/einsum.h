// Einsum equation parsing shared by the shape rule and the kernel.
#pragma once
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include <string>
#include <vector>

namespace sd {

struct EinsumSpec {
  std::vector<std::vector<int>> inputLabels; // label ids per operand dim
  std::vector<int> outputLabels;
  std::vector<int64_t> labelSize; // by label id (unknown: -1)
  int numLabels = 0;
};

// Parses "ij,jk->ik" (with "..." ellipsis and implicit output) against operand dims.
Status parseEinsum(const std::string &equation, const std::vector<Dims> &dims, EinsumSpec &spec);

} // namespace sd
