// The compile driver: load, import, run the pipeline, emit.
#include "Driver.h"
#include <algorithm>
#include "EmitPlan.h"
#include "OnnxFrontend.h"
#include "OnnxImporter.h"
#include "PassDetail.h"
#include "SDDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"
#include "sd/runtime/json.h"

namespace sd {

static std::string configJson(const CompileRequest &r) {
  auto list = [](const std::vector<std::string> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + jsonQuote(v[i]);
    return s + "]";
  };
  return "{\"shapes\":" + list(r.pipeline.shapes) + ",\"dims\":" + list(r.pipeline.dims) +
         ",\"external_weights\":" + (r.externalWeights ? "true" : "false") +
         (r.pipeline.training() ? ",\"peft\":" + jsonQuote(r.pipeline.peft) + ",\"recipe\":" + jsonQuote(r.pipeline.recipe) +
                                      ",\"optimizer\":" + jsonQuote(r.pipeline.optimizer)
                                : std::string()) +
         "}";
}

bool compileModel(const CompileRequest &req, std::string &error, std::string *irOut) {
  LoadedModel loaded;
  if (!loadOnnxModel(req.model, loaded, error)) return false;
  if (req.verbose)
    for (auto &n : loaded.notes) llvm::errs() << "sdc: note: " << n << "\n";

  mlir::MLIRContext ctx;
  ctx.loadDialect<ir::SDDialect, mlir::func::FuncDialect>();
  // Keep the first error diagnostic as one line naming the node.
  std::string firstError;
  mlir::ScopedDiagnosticHandler handler(&ctx, [&](mlir::Diagnostic &d) {
    if (d.getSeverity() == mlir::DiagnosticSeverity::Error && firstError.empty()) {
      std::string node = nodeNameOf(d.getLocation());
      firstError = d.str();
      if (!node.empty() && firstError.find(node) == std::string::npos) firstError = "node '" + node + "': " + firstError;
    }
    return mlir::success();
  });

  ImportOptions iopts;
  iopts.modelPath = req.model;
  for (const std::string &spec : req.pipeline.shapes) { // "x=2x3[,4x3]": rank of the first value
    size_t eq = spec.rfind('=');
    if (eq == std::string::npos) continue;
    std::string first = spec.substr(eq + 1, spec.find(',', eq) - eq - 1);
    iopts.inputRanks[spec.substr(0, eq)] =
        first == "scalar" ? 0 : int64_t(std::count(first.begin(), first.end(), 'x') + 1);
  }
  std::vector<onnx::TensorProto> bound(req.binds.size());
  for (size_t i = 0; i < req.binds.size(); ++i) {
    if (!loadTensorProto(req.binds[i].second, bound[i], error)) return false;
    iopts.bindings[req.binds[i].first] = &bound[i];
  }
  auto module = importOnnxModel(&ctx, loaded.model, iopts, error);
  if (!module) return false;
  auto printTo = [&](std::string *out) {
    llvm::raw_string_ostream os(*out);
    module->print(os);
    os << "\n";
  };
  if (req.emit == "import") {
    if (irOut) printTo(irOut);
    return true;
  }
  mlir::PassManager pm(&ctx);
  if (req.pipeline.printIrAfterAll) {
    ctx.disableMultithreading();
    pm.enableIRPrinting([](mlir::Pass *, mlir::Operation *) { return false; },
                        [](mlir::Pass *, mlir::Operation *) { return true; }, true, false, false, llvm::errs());
  }
  buildTensorPipeline(pm, req.pipeline);
  buildPlanPipeline(pm);
  if (mlir::failed(pm.run(*module))) {
    error = req.model + ": " + (firstError.empty() ? "compilation failed" : firstError);
    return false;
  }
  if (req.emit == "mlir") {
    if (irOut) printTo(irOut);
    return true;
  }
  EmitOptions eopts;
  eopts.outputPath = req.output;
  eopts.externalWeights = req.externalWeights;
  eopts.producer = std::string("sdc ") + SD_VERSION;
  eopts.sourceSha256 = loaded.sha256;
  eopts.config = configJson(req);
  return mlir::succeeded(emitPlan(*module, eopts, error));
}

} // namespace sd
