// Pass pipeline construction.
#include "Pipeline.h"
#include "Passes.h"

namespace sd {

void registerSdPasses() { registerSDPasses(); }

void buildTensorPipeline(mlir::OpPassManager &pm, const PipelineOptions &opts) {
  pm.addPass(createFormLinear());
  pm.addPass(createFuseGelu());
  SpecializeOptions spec;
  spec.shapes = opts.shapes;
  spec.dims = opts.dims;
  pm.addPass(createSpecialize(spec));
  pm.addPass(createPropagateShapes());
  pm.addPass(createCheckStatic());
}

void buildPlanPipeline(mlir::OpPassManager &pm) {
  pm.addPass(createBufferize());
  pm.addPass(createInPlaceReuse());
  pm.addPass(createLiveness());
  pm.addPass(createPackArena());
}

} // namespace sd
