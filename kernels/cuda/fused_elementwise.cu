// FusedElementwise on CUDA (sd/ops/fused_elementwise.h): each thread runs
// the program on kPack consecutive elements, loaded and stored as vectors. The non-contracting
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

// V consecutive elements from element i (a multiple of V; the pointer is
// aligned for V elements when V > 1) of an operand or the result.
template <int V> __device__ inline void loadAs(Storage t, const void *p, int64_t i, float (&v)[V]) {
  if (t == Storage::BF16) {
    const auto a = static_cast<const Pack<__nv_bfloat16, V> *>(p)[i / V];
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = __bfloat162float(a.v[k]);
  } else if (t == Storage::F16) {
    const auto a = static_cast<const Pack<__half, V> *>(p)[i / V];
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = __half2float(a.v[k]);
  } else {
    const auto a = static_cast<const Pack<float, V> *>(p)[i / V];
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = a.v[k];
  }
}

template <int V> __device__ inline void storeAs(Storage t, void *p, int64_t i, const float (&v)[V]) {
  if (t == Storage::BF16) {
    Pack<__nv_bfloat16, V> a;
#pragma unroll
    for (int k = 0; k < V; ++k) a.v[k] = __float2bfloat16_rn(v[k]);
    static_cast<Pack<__nv_bfloat16, V> *>(p)[i / V] = a;
  } else if (t == Storage::F16) {
    Pack<__half, V> a;
#pragma unroll
    for (int k = 0; k < V; ++k) a.v[k] = __float2half_rn(v[k]);
    static_cast<Pack<__half, V> *>(p)[i / V] = a;
  } else {
    Pack<float, V> a;
#pragma unroll
    for (int k = 0; k < V; ++k) a.v[k] = v[k];
    static_cast<Pack<float, V> *>(p)[i / V] = a;
  }
}

inline size_t storageBytes(Storage t) { return t == Storage::F32 ? 4 : 2; }

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
  case ElementwiseOpcode::ReluGrad: return b > 0.f ? a : 0.f;
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

// Operand k's V elements from element i; a single-element operand broadcast.
template <int V> __device__ inline void loadOperand(const Program &p, int k, int64_t i, float (&v)[V]) {
  if (p.scalar[k]) {
    float one[1];
    loadAs<1>(p.type[k], p.in[k], 0, one);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = one[0];
  } else {
    loadAs<V>(p.type[k], p.in[k], i, v);
  }
}

// Elements [first, first + groups * V), V per thread: the program is decoded
// once for V elements, and V = kPack loads and stores them as vectors.
template <int V> __global__ void fusedKernel(Program p, void *out, int64_t first, int64_t groups) {
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = first + g * V;
    float v[kMaxFusedValues][V];
#pragma unroll
    for (int k = 0; k < kMaxFusedInputs; ++k)
      if (k < p.inputs) loadOperand<V>(p, k, i, v[k]);
    for (int s = 0; s < p.steps; ++s) {
      const int op = p.op[s];
      const float(&a)[V] = v[p.lhs[s]];
      const float(&b)[V] = v[p.rhs[s]];
      float(&r)[V] = v[p.inputs + s];
#pragma unroll
      for (int j = 0; j < V; ++j) r[j] = apply(op, a[j], b[j]);
    }
    storeAs<V>(p.result, out, i, v[p.inputs + p.steps - 1]);
  }
}

// The programs sd-fuse-elementwise makes of transformer training steps
// (GPT-2 and Llama, LoRA and full, f32 and bf16: all but 0.1% of their fused
// bytes; their inference entries too), compiled with the program known: the
// values stay in registers and no instruction is decoded per element. The
// interpreter above (each value a round trip through local memory) runs any
// other program.
template <int Inputs, int... Code> __global__ void fusedStaticKernel(Program p, void *out, int64_t groups) {
  constexpr int code[] = {Code...};
  constexpr int steps = int(sizeof...(Code)) / 3;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = g * kPack;
    float v[Inputs + steps][kPack];
#pragma unroll
    for (int k = 0; k < Inputs; ++k) loadOperand<kPack>(p, k, i, v[k]);
#pragma unroll
    for (int s = 0; s < steps; ++s)
#pragma unroll
      for (int j = 0; j < kPack; ++j) v[Inputs + s][j] = apply(code[3 * s], v[code[3 * s + 1]][j], v[code[3 * s + 2]][j]);
    storeAs<kPack>(p.result, out, i, v[Inputs + steps - 1]);
  }
}

struct StaticProgram {
  int inputs;
  std::vector<int64_t> code;
  void (*kernel)(Program, void *, int64_t);
};

#define SD_STATIC_PROGRAM(INPUTS, ...) StaticProgram{INPUTS, {__VA_ARGS__}, fusedStaticKernel<INPUTS, __VA_ARGS__>}
const std::vector<StaticProgram> &staticPrograms() {
  static const std::vector<StaticProgram> programs = {
      SD_STATIC_PROGRAM(3, 2, 0, 1, 0, 2, 3),                // scale and add (LoRA's branch into the base product)
      SD_STATIC_PROGRAM(3, 0, 0, 1, 12, 3, 2),               // add, then tanh GELU's gradient
      SD_STATIC_PROGRAM(2, 0, 1, 0),                         // add (operand first)
      SD_STATIC_PROGRAM(2, 0, 0, 1),                         // add
      SD_STATIC_PROGRAM(2, 2, 0, 1),                         // multiply
      SD_STATIC_PROGRAM(3, 2, 1, 2, 0, 0, 3),                // base + LoRA * scale
      SD_STATIC_PROGRAM(4, 2, 0, 1, 0, 2, 4, 0, 3, 5),       // scale, add, add (residual)
      SD_STATIC_PROGRAM(4, 2, 1, 2, 0, 0, 4, 0, 3, 5),       // base + LoRA * scale + residual
      SD_STATIC_PROGRAM(1, 10, 0, 0),                        // tanh GELU
      SD_STATIC_PROGRAM(1, 9, 0, 0),                         // GELU
      SD_STATIC_PROGRAM(2, 12, 0, 1),                        // tanh GELU's gradient
      SD_STATIC_PROGRAM(2, 11, 0, 1),                        // GELU's gradient
      SD_STATIC_PROGRAM(2, 12, 1, 0),                        // tanh GELU's gradient, the product first
      SD_STATIC_PROGRAM(2, 11, 1, 0),                        // GELU's gradient, the product first
      SD_STATIC_PROGRAM(3, 2, 1, 2, 0, 0, 3, 10, 4, 4),      // base + LoRA * scale, then tanh GELU
      SD_STATIC_PROGRAM(5, 2, 1, 2, 0, 0, 5, 0, 3, 4, 12, 7, 6), // that sum again, tanh GELU's gradient of two
      SD_STATIC_PROGRAM(4, 0, 0, 1, 0, 4, 2, 0, 5, 3),       // sum of four
      SD_STATIC_PROGRAM(3, 0, 0, 1, 0, 3, 2),                // sum of three
      SD_STATIC_PROGRAM(3, 0, 0, 1, 0, 2, 3),                // sum of three
  };
  return programs;
}
#undef SD_STATIC_PROGRAM

const StaticProgram *staticProgramFor(int inputs, const std::vector<int64_t> &code) {
  for (const StaticProgram &s : staticPrograms())
    if (s.inputs == inputs && s.code == code) return &s;
  return nullptr;
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
  // Packs where every full-size operand and the result are aligned for them,
  // then the elements after the last pack one per thread.
  bool packed = reinterpret_cast<uintptr_t>(c.outputs[0].data) % (storageBytes(p.result) * kPack) == 0;
  for (int k = 0; k < p.inputs; ++k)
    packed = packed && (p.scalar[k] || reinterpret_cast<uintptr_t>(p.in[k]) % (storageBytes(p.type[k]) * kPack) == 0);
  const int64_t packs = packed ? n / kPack : 0;
  if (packs > 0) {
    if (const StaticProgram *compiled = staticProgramFor(p.inputs, program))
      compiled->kernel<<<blocksFor(packs), kThreads, 0, streamOf(c)>>>(p, c.outputs[0].data, packs);
    else
      fusedKernel<kPack><<<blocksFor(packs), kThreads, 0, streamOf(c)>>>(p, c.outputs[0].data, 0, packs);
  }
  if (n > packs * kPack)
    fusedKernel<1><<<blocksFor(n - packs * kPack), kThreads, 0, streamOf(c)>>>(p, c.outputs[0].data, packs * kPack,
                                                                                n - packs * kPack);
  return launchStatus("FusedElementwise");
}

} // namespace

// Operands of several types: the kernel checks each (the binding reads operand 0's).
void registerFusedElementwiseKernels() {
  registerKernel("FusedElementwise", FusedElementwiseKernel, TypeSet{DType::F32, DType::BF16, DType::F16});
}

} // namespace sd::cuda
