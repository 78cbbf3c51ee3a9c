// Serializes a module in step IR into a .sdp plan file. Nothing is decided here:
// offsets, steps and globals come from the passes.
#pragma once
#include "mlir/IR/BuiltinOps.h"
#include <array>
#include <string>

namespace sd {

struct EmitOptions {
  std::string outputPath;
  bool externalWeights = false; // weights go to <output stem>.safetensors
  std::string producer;
  std::array<uint8_t, 32> sourceSha256{};
  std::string config; // JSON describing how the plan was compiled
  std::vector<std::pair<std::string, std::string>> files; // carried as they are: name, bytes
};

// Writes atomically: on error no output file is left behind.
mlir::LogicalResult emitPlan(mlir::ModuleOp module, const EmitOptions &opts, std::string &error);

} // namespace sd
