// The compile pipeline, shared by sdc and the tests: model-level passes,
// specialization, bufferization and arena planning, in order.
#pragma once
#include "mlir/Pass/PassManager.h"
#include <string>
#include <vector>

namespace sd {

struct PipelineOptions {
  std::vector<std::string> shapes; // INPUT=DxD[,DxD]
  std::vector<std::string> dims;   // NAME=N[,N]
  bool printIrAfterAll = false;
};

void registerSdPasses();
// Model-level passes up to (and including) shape specialization and checks.
void buildTensorPipeline(mlir::OpPassManager &pm, const PipelineOptions &opts);
// Bufferization and memory planning.
void buildPlanPipeline(mlir::OpPassManager &pm);

} // namespace sd
