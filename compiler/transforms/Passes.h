// Declarations of all sd passes (generated from Passes.td) and pipelines.
#pragma once
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

namespace sd {
#define GEN_PASS_DECL
#include "Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Passes.h.inc"
} // namespace sd
