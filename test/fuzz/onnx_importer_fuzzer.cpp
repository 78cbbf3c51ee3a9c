// libFuzzer target: arbitrary bytes as an ONNX model (binary, or ONNX text when
// the first byte is '<'), through the frontend, the importer and the pipeline,
// then imported once more as for training, which reads what PyTorch's
// exporters leave in the model (TorchExports.cpp: metadata, FX sources,
// folded copies) and repairs what their optimizer merged.
#include "OnnxFrontend.h"
#include "OnnxImporter.h"
#include "Pipeline.h"
#include "SDDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string bytes(reinterpret_cast<const char *>(data), size);
  bool text = size > 0 && data[0] == '<';
  sd::LoadedModel model;
  std::string error;
  if (!sd::loadOnnxModelFromBytes(bytes, text, "fuzz.onnx", "/nonexistent", model, error)) return 0;
  mlir::MLIRContext ctx;
  ctx.loadDialect<sd::ir::SDDialect, mlir::func::FuncDialect>();
  mlir::ScopedDiagnosticHandler quiet(&ctx, [](mlir::Diagnostic &) { return mlir::success(); });
  sd::ImportOptions opts;
  opts.modelPath = "fuzz.onnx";
  auto module = sd::importOnnxModel(&ctx, model.model, opts, error);
  if (module) {
    mlir::PassManager pm(&ctx);
    sd::buildTensorPipeline(pm, sd::PipelineOptions{});
    sd::buildPlanPipeline(pm);
    (void)pm.run(*module);
  }
  opts.training = true;
  (void)sd::importOnnxModel(&ctx, model.model, opts, error);
  return 0;
}
