// f32 data in and out of sd.global ops: passes that create weights at compile
// time (LoRA and OSF factors, a classification head, concatenated
// projections) and passes that read a weight's values or fold values computed
// from frozen weights.
#pragma once
#include "SDDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include <random>
#include <vector>

namespace sd {
// The global `name` (made by getOrCreateGlobal) of f32 `shape` and `role`,
// holding `values` as a dense resource blob; no initial value when `values`
// is null (a zero-initialized state such as LoRA's B).
sd::ir::GlobalOp createFloatGlobal(mlir::ModuleOp module, llvm::StringRef name, llvm::ArrayRef<int64_t> shape,
                                   llvm::StringRef role, const std::vector<float> *values);
// `n` values drawn from U(-bound, bound) in order: nn.Linear's and PEFT's
// kaiming_uniform_(a=sqrt(5)) of a [rows, cols] weight is bound 1/sqrt(cols).
std::vector<float> uniformFloats(size_t n, double bound, std::mt19937_64 &rng);
// PEFT's kaiming_uniform_(a=sqrt(5)) of a [rows, cols] factor: uniformFloats with bound 1/sqrt(cols).
std::vector<float> kaimingUniform(int64_t rows, int64_t cols, std::mt19937_64 &rng);
// PyTorch's Tensor.uniform_(-bound, bound, generator) on the CPU for f32, with
// `gen` a torch.Generator's mt19937 (manual_seed(k) is std::mt19937(k)): 24
// random bits of each 32-bit draw, in order. PEFT's VeRA projections.
std::vector<float> torchUniformFloats(size_t n, double bound, std::mt19937 &gen);
// Whether the compiler may read and fold `g`'s value: a frozen weight or a
// constant, with an initial value (trainable and state globals change at run time).
bool hasFrozenValue(sd::ir::GlobalOp g);
// The global `v` loads when the compiler may read its value (hasFrozenValue),
// else null.
sd::ir::GlobalOp frozenGlobalOf(mlir::Value v);
// The value of `v` when it depends on nothing but constants and frozen
// weights of at most `maxWeightBytes` each: the slice computing it, run by the
// CPU kernels with those weights as constants (no result over `maxFoldBytes`).
// Null otherwise.
mlir::DenseElementsAttr foldFromFrozenWeights(mlir::Value v, int64_t maxWeightBytes, int64_t maxFoldBytes);
// The floats of a global's initial value (dense or dense_resource, not a
// splat), or empty when it has none to read.
llvm::ArrayRef<float> floatsOf(sd::ir::GlobalOp g);
} // namespace sd
