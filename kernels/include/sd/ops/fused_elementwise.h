// FusedElementwise (sd-fuse-elementwise): a chain of f32 elementwise ops
// computed in one pass over its operands. The chain is a program of (opcode,
// lhs, rhs) triples over a value list: values 0..inputs-1 are the operands,
// each instruction appends its result, the last value is the output. Each
// backend computes every instruction with the very function its unfused
// kernel uses (IEEE's exactly rounded +, -, *, /; the CPU's vectorized
// activations; CUDA's shared math), so the fused chain gives the unfused
// steps' bits on that backend (the CUDA kernel uses the non-contracting
// intrinsics between instructions: no fused multiply-add across them).
// Operands may be bf16 or f16 (the Cast to f32 an autocast plan puts after a
// half product, absorbed: widening is exact), and the result (attribute `to`,
// an ONNX type code; f32 when absent) may be narrowed to one (the Cast before
// the next half product, absorbed: rounded to nearest even, as Cast rounds).
#pragma once
#include "sd/format/dtype.h"
#include "sd/format/status.h"
#include "sd/ops/math/host_device.h"
#include <cstdint>
#include <vector>

namespace sd {

// Unary ones read lhs only; GeluErfGrad/GeluTanhGrad are GeluGrad (lhs dy, rhs x);
// ReluGrad is Relu's gradient as its VJP writes it, Where(Greater(x, 0), dy, 0)
// (lhs dy, rhs x): dy where x > 0, else 0 (a NaN x gives 0).
enum class ElementwiseOpcode : int64_t {
  Add = 0, Sub = 1, Mul = 2, Div = 3, Neg = 4, Relu = 5, Sigmoid = 6, Tanh = 7, Exp = 8, GeluErf = 9, GeluTanh = 10,
  GeluErfGrad = 11, GeluTanhGrad = 12, ReluGrad = 13
};
constexpr int64_t kLastElementwiseOpcode = int64_t(ElementwiseOpcode::ReluGrad);

// The element types of the operands and the result: f32 and the two halves.
inline bool isFusedStorage(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

constexpr int kMaxFusedInputs = 8;
constexpr int kMaxFusedInstructions = 16;
constexpr int kMaxFusedValues = kMaxFusedInputs + kMaxFusedInstructions;

// A program checked against its operand count: every opcode known, every
// operand index naming a value computed before it (a corrupt plan's program
// is refused, never run).
inline Status checkFusedProgram(const std::vector<int64_t> &program, int64_t inputs) {
  if (inputs < 1 || inputs > kMaxFusedInputs)
    return sdError("FusedElementwise takes 1 to ", kMaxFusedInputs, " operands, got ", inputs);
  if (program.empty() || program.size() % 3 || int64_t(program.size() / 3) > kMaxFusedInstructions)
    return sdError("FusedElementwise program must be 1 to ", kMaxFusedInstructions, " (opcode, lhs, rhs) triples");
  for (size_t i = 0; i < program.size(); i += 3) {
    const int64_t op = program[i], values = inputs + int64_t(i / 3);
    if (op < 0 || op > kLastElementwiseOpcode) return sdError("FusedElementwise opcode ", op, " is unknown");
    for (int64_t operand : {program[i + 1], program[i + 2]})
      if (operand < 0 || operand >= values)
        return sdError("FusedElementwise instruction ", i / 3, " reads value ", operand, " of ", values);
  }
  return Status::ok();
}

} // namespace sd
