// CUDA kernel for Einsum: the CPU kernel's direct walk (kernels/cpu/einsum.cc),
// one thread per output element summing the products over the contracted
// labels in the same order, in f64. Correct for every equation of up to
// kMaxLabels labels and kMaxOperands operands; products that are matrix
// multiplications reach cuBLASLt through MatMul once exporters emit them so.
#include "cuda_util.cuh"
#include "sd/ops/einsum.h"

namespace sd::cuda {
namespace {

constexpr int kMaxLabels = 16, kMaxOperands = 4;

struct EinsumWalk {
  int operands = 0, labels = 0, outputLabels = 0, summedLabels = 0;
  int output[kMaxLabels] = {}, summed[kMaxLabels] = {};
  int64_t size[kMaxLabels] = {};
  int64_t stride[kMaxOperands][kMaxLabels] = {}; // 0 where an operand lacks the label or broadcasts it
  int64_t sumCount = 1;
};

template <typename T> struct Operands {
  const T *p[kMaxOperands] = {};
};

// Sets val[labels[k]] to the digits of `index` in the mixed radix of the labels' sizes.
__device__ inline void decodeLabels(int64_t index, const int *labels, int count, const int64_t *size, int64_t *val) {
  for (int k = count - 1; k >= 0; --k) {
    val[labels[k]] = index % size[labels[k]];
    index /= size[labels[k]];
  }
}

template <typename T> __global__ void einsumKernel(EinsumWalk w, Operands<T> in, T *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t val[kMaxLabels] = {};
    decodeLabels(i, w.output, w.outputLabels, w.size, val);
    double acc = 0;
    for (int64_t s = 0; s < w.sumCount; ++s) {
      decodeLabels(s, w.summed, w.summedLabels, w.size, val);
      double prod = 1;
      for (int t = 0; t < w.operands; ++t) {
        int64_t off = 0;
        for (int l = 0; l < w.labels; ++l) off += val[l] * w.stride[t][l];
        prod *= double(load(in.p[t][off]));
      }
      acc += prod;
    }
    y[i] = store<T>(Compute<T>(acc));
  }
}

Status EinsumKernel(const KernelContext &c) {
  EinsumSpec spec;
  std::vector<Dims> dims;
  for (const TensorView &t : c.inputs) dims.push_back(t.dims);
  SD_RETURN_IF_ERROR(parseEinsum(c.attrs.getString("equation", ""), dims, spec));
  if (spec.numLabels > kMaxLabels || c.inputs.size() > size_t(kMaxOperands))
    return sdError("Einsum on CUDA takes up to ", kMaxLabels, " labels and ", kMaxOperands, " operands");
  const TensorView &y = c.outputs[0];
  for (const TensorView &t : c.inputs)
    if (t.dtype != y.dtype) return sdError("Einsum operands differ in element type");
  EinsumWalk w;
  w.operands = int(c.inputs.size());
  w.labels = spec.numLabels;
  std::vector<bool> inOutput(size_t(spec.numLabels), false);
  for (int l : spec.outputLabels) {
    inOutput[size_t(l)] = true;
    w.output[w.outputLabels++] = l;
  }
  for (int l = 0; l < spec.numLabels; ++l) {
    w.size[l] = spec.labelSize[size_t(l)];
    if (!inOutput[size_t(l)]) {
      w.summed[w.summedLabels++] = l;
      w.sumCount *= w.size[l];
    }
  }
  for (size_t t = 0; t < c.inputs.size(); ++t) {
    const Dims st = stridesOf(dims[t]);
    for (size_t k = 0; k < spec.inputLabels[t].size(); ++k)
      if (dims[t][k] != 1) w.stride[t][spec.inputLabels[t][k]] += st[k];
  }
  const int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    Operands<T> in;
    for (size_t t = 0; t < c.inputs.size(); ++t) in.p[t] = c.inputs[t].as<T>();
    einsumKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(w, in, y.as<T>(), n);
    return launchStatus("Einsum");
  };
  if (y.dtype == DType::I64) return launch(int64_t{});
  if (y.dtype == DType::I32) return launch(int32_t{});
  return dispatchFloatStorage(y.dtype, launch);
}

} // namespace

void registerEinsumKernels() {
  registerKernel("Einsum", EinsumKernel, floatStorage() | TypeSet{DType::I64, DType::I32});
}

} // namespace sd::cuda
