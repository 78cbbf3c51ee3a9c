// One place that registers every shape rule and CPU kernel, once.
#include "cpu_util.h"
#include <mutex>

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
void registerOptimizerKernels();
void registerDropoutKernels();
void registerAttentionKernels();

void registerCpuKernel(const char *op, KernelFn fn, PrepareFn prepare) {
  OpDef d;
  d.name = op;
  d.cpu = fn;
  d.prepare = prepare;
  registerOp(std::move(d));
}
} // namespace cpu

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
    cpu::registerOptimizerKernels();
    cpu::registerDropoutKernels();
    cpu::registerAttentionKernels();
    computeHalfViaF32({"Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh",
                       "Cosh", "Asinh", "Acosh", "Atanh", "Tanh", "Erf", "Sigmoid", "HardSigmoid", "HardSwish",
                       "LeakyRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Softplus", "Softsign", "Mish", "Gelu",
                       "Neg", "Abs", "Sign", "Relu", "Floor", "Ceil", "Round", "Add", "Sub", "Mul", "Div", "Mod",
                       "Pow", "PRelu", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Min", "Max",
                       "Sum", "Mean", "Clip", "Softmax", "LogSoftmax", "LayerNormalization"});
  });
}

} // namespace sd
