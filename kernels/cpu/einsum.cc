// CPU kernel for Einsum: a direct walk over output and contracted labels.
// Correct for every equation; attention-style batched products run through
// MatMul once exporters emit them that way.
#include "cpu_util.h"
#include "sd/ops/einsum.h"

namespace sd::cpu {
namespace {

Status EinsumKernel(const KernelContext &c) {
  EinsumSpec spec;
  std::vector<Dims> dims;
  for (auto &t : c.inputs) dims.push_back(t.dims);
  SD_RETURN_IF_ERROR(parseEinsum(c.attrs.getString("equation", ""), dims, spec));
  const TensorView &y = c.outputs[0];
  std::vector<bool> inOutput(size_t(spec.numLabels), false);
  for (int l : spec.outputLabels) inOutput[size_t(l)] = true;
  std::vector<int> summed;
  for (int l = 0; l < spec.numLabels; ++l)
    if (!inOutput[size_t(l)]) summed.push_back(l);
  // Per operand, the stride of each label (0 where the label is absent or broadcast).
  std::vector<std::vector<int64_t>> strides(c.inputs.size(), std::vector<int64_t>(size_t(spec.numLabels), 0));
  for (size_t t = 0; t < c.inputs.size(); ++t) {
    Dims st = stridesOf(dims[t]);
    for (size_t k = 0; k < spec.inputLabels[t].size(); ++k)
      if (dims[t][k] != 1) strides[t][size_t(spec.inputLabels[t][k])] += st[k];
  }
  int64_t sumCount = 1;
  for (int l : summed) sumCount *= spec.labelSize[size_t(l)];
  return dispatchNumeric(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<int64_t> val(size_t(spec.numLabels), 0);
    for (int64_t i = 0, n = y.numElements(); i < n; ++i) {
      int64_t rem = i;
      for (int64_t k = int64_t(spec.outputLabels.size()) - 1; k >= 0; --k) {
        int l = spec.outputLabels[size_t(k)];
        val[size_t(l)] = rem % spec.labelSize[size_t(l)];
        rem /= spec.labelSize[size_t(l)];
      }
      double acc = 0;
      for (int64_t s = 0; s < sumCount; ++s) {
        int64_t r2 = s;
        for (int64_t k = int64_t(summed.size()) - 1; k >= 0; --k) {
          int l = summed[size_t(k)];
          val[size_t(l)] = r2 % spec.labelSize[size_t(l)];
          r2 /= spec.labelSize[size_t(l)];
        }
        double prod = 1;
        for (size_t t = 0; t < c.inputs.size(); ++t) {
          int64_t off = 0;
          for (int l = 0; l < spec.numLabels; ++l) off += val[size_t(l)] * strides[t][size_t(l)];
          prod *= double(c.inputs[t].as<T>()[off]);
        }
        acc += prod;
      }
      y.as<T>()[i] = T(acc);
    }
    return Status::ok();
  });
}

} // namespace

void registerEinsumKernels() { registerCpuKernel("Einsum", EinsumKernel, TypeSet::numeric()); }

} // namespace sd::cpu
