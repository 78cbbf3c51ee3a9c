// FusedElementwise on the CPU (sd/ops/fused_elementwise.h): each thread takes
// a range of elements in cache-sized chunks and runs the program over a chunk
// one instruction at a time (each a plain vectorizable loop), so the chain's
// intermediates never leave the cache. The same IEEE operations in the same
// order as the unfused kernels: the same bits.
#include "cpu_util.h"
#include "sd/ops/fused_elementwise.h"
#include "sd/ops/kernel.h"
#include <algorithm>

namespace sd::cpu {
namespace {

constexpr int64_t kChunk = 512;

void apply(ElementwiseOpcode op, const float *a, const float *b, float *out, int64_t n) {
  switch (op) {
  case ElementwiseOpcode::Add: for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i]; break;
  case ElementwiseOpcode::Sub: for (int64_t i = 0; i < n; ++i) out[i] = a[i] - b[i]; break;
  case ElementwiseOpcode::Mul: for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i]; break;
  case ElementwiseOpcode::Div: for (int64_t i = 0; i < n; ++i) out[i] = a[i] / b[i]; break;
  case ElementwiseOpcode::Neg: for (int64_t i = 0; i < n; ++i) out[i] = -a[i]; break;
  }
}

Status FusedElementwiseKernel(const KernelContext &c) {
  const std::vector<int64_t> program = c.attrs.getInts("program");
  const int64_t inputs = int64_t(c.inputs.size()), steps = int64_t(program.size() / 3);
  SD_RETURN_IF_ERROR(checkFusedProgram(program, inputs));
  const int64_t n = c.outputs[0].numElements();
  for (const TensorView &in : c.inputs)
    SD_CHECK_ARG(in.numElements() == n || in.numElements() == 1, "FusedElementwise operand has ", in.numElements(),
                 " elements, the result ", n);
  float *out = c.outputs[0].as<float>();
  parallelFor(c.pool, n, 8192, [&](int64_t begin, int64_t end) {
    // A scalar operand repeated over a chunk; intermediate results.
    float scalars[kMaxFusedInputs][kChunk], values[kMaxFusedInstructions][kChunk];
    for (int64_t i = 0; i < inputs; ++i)
      if (c.inputs[size_t(i)].numElements() == 1 && n != 1) std::fill_n(scalars[i], kChunk, c.inputs[size_t(i)].as<float>()[0]);
    for (int64_t at = begin; at < end; at += kChunk) {
      const int64_t len = std::min(kChunk, end - at);
      const float *value[kMaxFusedValues];
      for (int64_t i = 0; i < inputs; ++i) {
        const TensorView &in = c.inputs[size_t(i)];
        value[i] = in.numElements() == n ? in.as<float>() + at : scalars[i];
      }
      for (int64_t s = 0; s < steps; ++s) {
        // The last instruction writes the result in place of the chunk (an
        // operand the result reuses is read element by element before).
        float *dst = s == steps - 1 ? out + at : values[s];
        apply(ElementwiseOpcode(program[size_t(3 * s)]), value[program[size_t(3 * s + 1)]],
              value[program[size_t(3 * s + 2)]], dst, len);
        value[inputs + s] = dst;
      }
    }
  });
  return Status::ok();
}

} // namespace

void registerFusedElementwiseKernels() {
  registerCpuKernel("FusedElementwise", FusedElementwiseKernel, TypeSet{DType::F32});
}

} // namespace sd::cpu
