// One place that registers every op schema and CPU kernel, once.
#include "cpu_util.h"
#include <mutex>
#include <set>

namespace sd {
void registerElementwiseShapes();
void registerLinalgShapes();
void registerReduceShapes();
void registerMovementShapes();
void registerLossShapes();
void registerConvShapes();
void registerResizeEinsumShapes();
void registerQuantizedShapes();
void registerGradientShapes();
void registerCollectiveShapes();
void registerOsftShapes();
void registerControlShapes();
void registerRecurrentShapes();
void registerSelectionShapes();
void registerSpectralShapes();
void registerGridSampleShapes();
void registerNonMaxSuppressionShapes();
void registerLinearAttentionShapes();
void registerRoiAlignShapes();
void registerTfIdfShapes();
void registerRotaryShapes();
void registerCachedAttentionShapes();
void registerSwiGLUShapes();
namespace cpu {
void registerElementwiseKernels();
void registerLinalgKernels();
void registerReduceKernels();
void registerSoftmaxKernels();
void registerNormalizationKernels();
void registerMovementKernels();
void registerIndexingKernels();
void registerGeneratorKernels();
void registerLossKernels();
void registerConvKernels();
void registerPoolKernels();
void registerResizeKernels();
void registerEinsumKernels();
void registerQuantizedKernels();
void registerMatMulNBitsKernels();
void registerOptimizerKernels();
void registerDropoutKernels();
void registerAttentionKernels();
void registerCollectiveKernels();
void registerOsftKernels();
void registerControlKernels();
void registerRecurrentKernels();
void registerSelectionKernels();
void registerSpectralKernels();
void registerGridSampleKernels();
void registerNonMaxSuppressionKernels();
void registerLinearAttentionKernels();
void registerRoiAlignKernels();
void registerTfIdfKernels();
void registerCol2ImKernels();
void registerDeformConvKernels();
void registerRotaryKernels();
void registerCachedAttentionKernels();
void registerSwiGLUKernels();
void registerGemmEpilogueKernels();
void registerFusedElementwiseKernels();

KernelRegistry &mutableCpuKernels() {
  static KernelRegistry r("cpu");
  return r;
}

// Ops whose CPU kernels compute f16/bf16 through f32 (runKernel widens them).
static bool computesHalfViaF32(std::string_view op) {
  static const std::set<std::string_view> ops = {
      "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
      "Acosh", "Atanh", "Tanh", "Erf", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu", "Celu",
      "ThresholdedRelu", "Softplus", "Softsign", "Mish", "Gelu", "Neg", "Abs", "Sign", "Relu", "Floor", "Ceil",
      "Round", "Add", "Sub", "Mul", "Div", "Mod", "Pow", "PRelu", "Equal", "Less", "LessOrEqual", "Greater",
      "GreaterOrEqual", "Min", "Max", "Sum", "Mean", "Clip", "Softmax", "LogSoftmax", "LayerNormalization",
      "LayerNormalizationGrad", "RMSNormalization", "RMSNormalizationGrad", "Rotary", "SwiGLU", "SwiGLUGrad",
      "SwiGLUPacked", "SwiGLUPackedGrad",
      // Mixed precision (sd-autocast): bf16 operands, f32 accumulation, result rounded once.
      "MatMul", "Gemm", "Linear", "LinearAdd", "LinearGelu", "GemmDGelu", "Attention", "AttentionGrad",
      "QkvAttention", "QkvAttentionGrad", "ReduceSum", "ReduceMean",
      // Exact in f32 (a max of rounded values rounds back to itself): ONNX Attention's masked-row test.
      "ReduceMax", "ReduceMin",
      // Exact in f32: a classification, and integers/ranges a half can hold.
      "IsNaN", "IsInf", "Range",
      // Rounded once from f32 results, as ONNX's reference computes them.
      "Swish", "Einsum", "Conv", "ConvTranspose", "LinearAttention"};
  return ops.count(op) != 0;
}

void registerCpuKernel(const char *op, KernelFn fn, TypeSet types, PrepareFn prepare, int typeOperand) {
  mutableCpuKernels().add(KernelDef{op, fn, prepare, types, typeOperand, computesHalfViaF32(op), {}});
}
} // namespace cpu

const KernelRegistry &cpuKernels() {
  registerAllOps();
  return cpu::mutableCpuKernels();
}

void registerAllOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    registerElementwiseShapes();
    registerLinalgShapes();
    registerReduceShapes();
    registerMovementShapes();
    registerLossShapes();
    registerConvShapes();
    registerResizeEinsumShapes();
    registerQuantizedShapes();
    registerGradientShapes();
    registerCollectiveShapes();
    registerOsftShapes();
    registerControlShapes();
    registerRecurrentShapes();
    registerSelectionShapes();
    registerSpectralShapes();
    registerGridSampleShapes();
    registerNonMaxSuppressionShapes();
    registerLinearAttentionShapes();
    registerRoiAlignShapes();
    registerTfIdfShapes();
    registerRotaryShapes();
    registerCachedAttentionShapes();
    registerSwiGLUShapes();
    cpu::registerElementwiseKernels();
    cpu::registerLinalgKernels();
    cpu::registerReduceKernels();
    cpu::registerSoftmaxKernels();
    cpu::registerNormalizationKernels();
    cpu::registerMovementKernels();
    cpu::registerIndexingKernels();
    cpu::registerGeneratorKernels();
    cpu::registerLossKernels();
    cpu::registerConvKernels();
    cpu::registerPoolKernels();
    cpu::registerResizeKernels();
    cpu::registerEinsumKernels();
    cpu::registerQuantizedKernels();
    cpu::registerMatMulNBitsKernels();
    cpu::registerOptimizerKernels();
    cpu::registerDropoutKernels();
    cpu::registerAttentionKernels();
    cpu::registerCollectiveKernels();
    cpu::registerOsftKernels();
    cpu::registerControlKernels();
    cpu::registerRecurrentKernels();
    cpu::registerSelectionKernels();
    cpu::registerSpectralKernels();
    cpu::registerGridSampleKernels();
    cpu::registerNonMaxSuppressionKernels();
    cpu::registerLinearAttentionKernels();
    cpu::registerRoiAlignKernels();
    cpu::registerTfIdfKernels();
    cpu::registerCol2ImKernels();
    cpu::registerDeformConvKernels();
    cpu::registerRotaryKernels();
    cpu::registerCachedAttentionKernels();
    cpu::registerSwiGLUKernels();
    cpu::registerGemmEpilogueKernels();
    cpu::registerFusedElementwiseKernels();
  });
}

} // namespace sd
