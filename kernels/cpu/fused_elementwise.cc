// FusedElementwise on the CPU (sd/ops/fused_elementwise.h): each thread takes
// a range of elements in cache-sized chunks and runs the program over a chunk
// one instruction at a time (each a vectorizable loop), so the chain's
// intermediates never leave the cache. The same functions in the same order
// as the unfused kernels, and half operands and results converted with the
// Cast kernel's own functions (half_convert.h): the same bits.
#include "cpu_util.h"
#include "half_convert.h"
#include "sd/ops/math/activations.h"
#include "vecmath.h"
#include "sd/ops/fused_elementwise.h"
#include "sd/ops/kernel.h"
#include <algorithm>

namespace sd::cpu {
namespace {

constexpr int64_t kChunk = 512;

// One instruction over a chunk, with the function the op's own kernel uses
// on f32 (elementwise.cc: the vectorized activations, Relu's compare,
// GeluGrad's tanh form elementwise).
void apply(ElementwiseOpcode op, const float *a, const float *b, float *out, int64_t n) {
  switch (op) {
  case ElementwiseOpcode::Add: for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i]; break;
  case ElementwiseOpcode::Sub: for (int64_t i = 0; i < n; ++i) out[i] = a[i] - b[i]; break;
  case ElementwiseOpcode::Mul: for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i]; break;
  case ElementwiseOpcode::Div: for (int64_t i = 0; i < n; ++i) out[i] = a[i] / b[i]; break;
  case ElementwiseOpcode::Neg: for (int64_t i = 0; i < n; ++i) out[i] = -a[i]; break;
  case ElementwiseOpcode::Relu: for (int64_t i = 0; i < n; ++i) out[i] = a[i] < 0.f ? 0.f : a[i]; break;
  case ElementwiseOpcode::ReluGrad: // a[i] read whatever b[i] is: a select the compiler vectorizes, no branch
    for (int64_t i = 0; i < n; ++i) {
      const float grad = a[i];
      out[i] = b[i] > 0.f ? grad : 0.f;
    }
    break;
  case ElementwiseOpcode::Sigmoid: vsigmoid(a, out, n); break;
  case ElementwiseOpcode::Tanh: vtanh(a, out, n); break;
  case ElementwiseOpcode::Exp: vexp(a, out, n); break;
  case ElementwiseOpcode::GeluErf: vgelu(a, out, n); break;
  case ElementwiseOpcode::GeluTanh: vgeluTanh(a, out, n); break;
  case ElementwiseOpcode::GeluErfGrad: vgeluGrad(a, b, out, n); break;
  case ElementwiseOpcode::GeluTanhGrad:
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * math::geluTanhGrad(b[i]);
    break;
  }
}

// n elements of a half tensor from `at` widened into f32 (exact).
void widen(const TensorView &t, int64_t at, float *out, int64_t n) { widenHalf(t.dtype, t.as<uint16_t>() + at, out, n); }

Status FusedElementwiseKernel(const KernelContext &c) {
  const std::vector<int64_t> program = c.attrs.getInts("program");
  const int64_t inputs = int64_t(c.inputs.size()), steps = int64_t(program.size() / 3);
  SD_RETURN_IF_ERROR(checkFusedProgram(program, inputs));
  const TensorView &result = c.outputs[0];
  const int64_t n = result.numElements();
  SD_CHECK_ARG(isFusedStorage(result.dtype), "FusedElementwise gives f32, bf16 or f16, not ", dtypeName(result.dtype));
  for (const TensorView &in : c.inputs) {
    SD_CHECK_ARG(isFusedStorage(in.dtype), "FusedElementwise takes f32, bf16 or f16 operands, not ", dtypeName(in.dtype));
    SD_CHECK_ARG(in.numElements() == n || in.numElements() == 1, "FusedElementwise operand has ", in.numElements(),
                 " elements, the result ", n);
  }
  parallelFor(c.pool, n, 8192, [&](int64_t begin, int64_t end) {
    // Operands as f32 (a single element repeated, a half chunk widened),
    // intermediate results, and the last one before a half result's rounding.
    float operands[kMaxFusedInputs][kChunk], values[kMaxFusedInstructions][kChunk], last[kChunk];
    for (int64_t i = 0; i < inputs; ++i) {
      const TensorView &in = c.inputs[size_t(i)];
      if (in.numElements() == 1 && n != 1) {
        float one = 0;
        if (in.dtype == DType::F32) one = in.as<float>()[0];
        else widen(in, 0, &one, 1);
        std::fill_n(operands[i], kChunk, one);
      }
    }
    for (int64_t at = begin; at < end; at += kChunk) {
      const int64_t len = std::min(kChunk, end - at);
      const float *value[kMaxFusedValues];
      for (int64_t i = 0; i < inputs; ++i) {
        const TensorView &in = c.inputs[size_t(i)];
        if (in.numElements() != n) { // a single element, repeated above
          value[i] = operands[i];
        } else if (in.dtype == DType::F32) {
          value[i] = in.as<float>() + at;
        } else {
          widen(in, at, operands[i], len);
          value[i] = operands[i];
        }
      }
      for (int64_t s = 0; s < steps; ++s) {
        // An f32 result's last instruction writes in place of the chunk (an
        // operand the result reuses is read element by element before).
        const bool final = s == steps - 1;
        float *dst = !final ? values[s] : result.dtype == DType::F32 ? result.as<float>() + at : last;
        apply(ElementwiseOpcode(program[size_t(3 * s)]), value[program[size_t(3 * s + 1)]],
              value[program[size_t(3 * s + 2)]], dst, len);
        value[inputs + s] = dst;
      }
      if (result.dtype != DType::F32) narrowHalf(result.dtype, last, result.as<uint16_t>() + at, len);
    }
  });
  return Status::ok();
}

} // namespace

void registerFusedElementwiseKernels() {
  // Operands of several types: the kernel checks each (the binding reads operand 0's).
  registerCpuKernel("FusedElementwise", FusedElementwiseKernel, TypeSet{DType::F32, DType::BF16, DType::F16});
}

} // namespace sd::cpu
