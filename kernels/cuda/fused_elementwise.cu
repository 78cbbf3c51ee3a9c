// FusedElementwise on CUDA (sd/ops/fused_elementwise.h): one thread per
// element runs the program on values held in registers. The non-contracting
// intrinsics (__fadd_rn, __fmul_rn, ...) round every operation on its own, as
// the unfused kernels do: nvcc would otherwise fuse a*b+c into one FMA and
// give other bits.
#include "cuda_util.cuh"
#include "sd/ops/fused_elementwise.h"

namespace sd::cuda {
namespace {

struct Program {
  int inputs = 0, steps = 0;
  int8_t op[kMaxFusedInstructions], lhs[kMaxFusedInstructions], rhs[kMaxFusedInstructions];
  const float *in[kMaxFusedInputs];
  bool scalar[kMaxFusedInputs];
};

__device__ inline float apply(int op, float a, float b) {
  switch (ElementwiseOpcode(op)) {
  case ElementwiseOpcode::Add: return __fadd_rn(a, b);
  case ElementwiseOpcode::Sub: return __fsub_rn(a, b);
  case ElementwiseOpcode::Mul: return __fmul_rn(a, b);
  case ElementwiseOpcode::Div: return __fdiv_rn(a, b);
  default: return -a;
  }
}

__global__ void fusedKernel(Program p, float *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v[kMaxFusedValues];
#pragma unroll
    for (int k = 0; k < kMaxFusedInputs; ++k)
      if (k < p.inputs) v[k] = p.in[k][p.scalar[k] ? 0 : i];
    for (int s = 0; s < p.steps; ++s) v[p.inputs + s] = apply(p.op[s], v[p.lhs[s]], v[p.rhs[s]]);
    out[i] = v[p.inputs + p.steps - 1];
  }
}

Status FusedElementwiseKernel(const KernelContext &c) {
  const std::vector<int64_t> program = c.attrs.getInts("program");
  SD_RETURN_IF_ERROR(checkFusedProgram(program, int64_t(c.inputs.size())));
  const int64_t n = c.outputs[0].numElements();
  if (n == 0) return Status::ok();
  Program p;
  p.inputs = int(c.inputs.size());
  p.steps = int(program.size() / 3);
  for (int k = 0; k < p.inputs; ++k) {
    const TensorView &in = c.inputs[size_t(k)];
    if (in.numElements() != n && in.numElements() != 1)
      return sdError("FusedElementwise operand has ", in.numElements(), " elements, the result ", n);
    p.in[k] = in.as<float>();
    p.scalar[k] = in.numElements() != n;
  }
  for (int s = 0; s < p.steps; ++s) {
    p.op[s] = int8_t(program[size_t(3 * s)]);
    p.lhs[s] = int8_t(program[size_t(3 * s + 1)]);
    p.rhs[s] = int8_t(program[size_t(3 * s + 2)]);
  }
  fusedKernel<<<blocksFor(n), kThreads, 0, streamOf(c)>>>(p, c.outputs[0].as<float>(), n);
  return launchStatus("FusedElementwise");
}

} // namespace

void registerFusedElementwiseKernels() { registerKernel("FusedElementwise", FusedElementwiseKernel, TypeSet{DType::F32}); }

} // namespace sd::cuda
