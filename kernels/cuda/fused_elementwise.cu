// FusedElementwise on CUDA (sd/ops/fused_elementwise.h): one thread per
// element runs the program on values held in registers. The non-contracting
// intrinsics (__fadd_rn, __fmul_rn, ...) round every operation on its own, as
// the unfused kernels do: nvcc would otherwise fuse a*b+c into one FMA and
// give other bits. Half operands are widened and a half result rounded as
// the Cast kernel does (__bfloat162float, __float2bfloat16_rn, ...).
#include "cuda_util.cuh"
#include "sd/ops/fused_elementwise.h"
#include "sd/ops/math/activations.h"
#include <cmath>

namespace sd::cuda {
namespace {

enum class Storage : int8_t { F32, BF16, F16 };

struct Program {
  int inputs = 0, steps = 0;
  int8_t op[kMaxFusedInstructions], lhs[kMaxFusedInstructions], rhs[kMaxFusedInstructions];
  const void *in[kMaxFusedInputs];
  Storage type[kMaxFusedInputs];
  bool scalar[kMaxFusedInputs];
  Storage result = Storage::F32;
};

__device__ inline float loadAs(Storage t, const void *p, int64_t i) {
  if (t == Storage::BF16) return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
  if (t == Storage::F16) return __half2float(static_cast<const __half *>(p)[i]);
  return static_cast<const float *>(p)[i];
}

__device__ inline void storeAs(Storage t, void *p, int64_t i, float v) {
  if (t == Storage::BF16) static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
  else if (t == Storage::F16) static_cast<__half *>(p)[i] = __float2half_rn(v);
  else static_cast<float *>(p)[i] = v;
}

bool storageOf(DType d, Storage &t) {
  switch (d) {
  case DType::F32: t = Storage::F32; return true;
  case DType::BF16: t = Storage::BF16; return true;
  case DType::F16: t = Storage::F16; return true;
  default: return false;
  }
}

// One instruction, with the function the op's own kernel uses (elementwise.cu).
__device__ inline float apply(int op, float a, float b) {
  switch (ElementwiseOpcode(op)) {
  case ElementwiseOpcode::Add: return __fadd_rn(a, b);
  case ElementwiseOpcode::Sub: return __fsub_rn(a, b);
  case ElementwiseOpcode::Mul: return __fmul_rn(a, b);
  case ElementwiseOpcode::Div: return __fdiv_rn(a, b);
  case ElementwiseOpcode::Relu: return math::relu(a);
  case ElementwiseOpcode::Sigmoid: return math::sigmoid(a);
  case ElementwiseOpcode::Tanh: return std::tanh(a);
  case ElementwiseOpcode::Exp: return std::exp(a);
  case ElementwiseOpcode::GeluErf: return math::geluErf(a);
  case ElementwiseOpcode::GeluTanh: return math::geluTanh(a);
  case ElementwiseOpcode::GeluErfGrad: return __fmul_rn(a, math::geluErfGrad(b));
  case ElementwiseOpcode::GeluTanhGrad: return __fmul_rn(a, math::geluTanhGrad(b));
  default: return -a;
  }
}

__global__ void fusedKernel(Program p, void *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v[kMaxFusedValues];
#pragma unroll
    for (int k = 0; k < kMaxFusedInputs; ++k)
      if (k < p.inputs) v[k] = loadAs(p.type[k], p.in[k], p.scalar[k] ? 0 : i);
    for (int s = 0; s < p.steps; ++s) v[p.inputs + s] = apply(p.op[s], v[p.lhs[s]], v[p.rhs[s]]);
    storeAs(p.result, out, i, v[p.inputs + p.steps - 1]);
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
  if (!storageOf(c.outputs[0].dtype, p.result))
    return sdError("FusedElementwise gives f32, bf16 or f16, not ", dtypeName(c.outputs[0].dtype));
  for (int k = 0; k < p.inputs; ++k) {
    const TensorView &in = c.inputs[size_t(k)];
    if (in.numElements() != n && in.numElements() != 1)
      return sdError("FusedElementwise operand has ", in.numElements(), " elements, the result ", n);
    if (!storageOf(in.dtype, p.type[k]))
      return sdError("FusedElementwise takes f32, bf16 or f16 operands, not ", dtypeName(in.dtype));
    p.in[k] = in.data;
    p.scalar[k] = in.numElements() != n;
  }
  for (int s = 0; s < p.steps; ++s) {
    p.op[s] = int8_t(program[size_t(3 * s)]);
    p.lhs[s] = int8_t(program[size_t(3 * s + 1)]);
    p.rhs[s] = int8_t(program[size_t(3 * s + 2)]);
  }
  fusedKernel<<<blocksFor(n), kThreads, 0, streamOf(c)>>>(p, c.outputs[0].data, n);
  return launchStatus("FusedElementwise");
}

} // namespace

// Operands of several types: the kernel checks each (the binding reads operand 0's).
void registerFusedElementwiseKernels() {
  registerKernel("FusedElementwise", FusedElementwiseKernel, TypeSet{DType::F32, DType::BF16, DType::F16});
}

} // namespace sd::cuda
