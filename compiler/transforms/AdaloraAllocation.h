// AdaLoRA's rank allocation (PEFT's RankAllocator with
// AdaLoraModel.update_and_allocate(global_step) after each optimizer step),
// as ops appended to the apply entry by sd-optimizer, so the trainer loop
// stays branch-free: every step computes every phase and selects.
#pragma once
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace sd {

// Whether `module` trains AdaLoRA adapters (sd-peft-adalora's sd.peft).
bool trainsAdalora(mlir::ModuleOp module);

// Appends the allocation to `apply` (its updates built; before its return):
// global_step is the optimizer step just taken minus one (PEFT's loops count
// from 0), and
//   global_step < T - tfinal   the sensitivity EMAs of every lora_A, lora_E,
//                              lora_B element take |p g| (p updated, g the
//                              step's mean, clipped gradient); on masking
//                              steps (after tinit, every deltaT) the triplets
//                              whose scores are among the init - budget lowest
//                              get E = 0, the budget cubic from init_r to
//                              target_r per module
//   global_step = T - tfinal   masked to the target budget on the scores so
//                              far; the kept triplets become the final pattern
//                              and the EMAs restart
//   global_step > T - tfinal   E = 0 outside the final pattern
// The EMAs and the pattern are optimizer state (checkpointed).
mlir::LogicalResult appendRankAllocation(mlir::ModuleOp module, mlir::func::FuncOp apply, mlir::Value newStep);

} // namespace sd
