// sdc: the compiler driver. `sdc compile MODEL -o PLAN` imports ONNX, runs the
// pass pipeline and writes a plan.
#include "EmitPlan.h"
#include "OnnxFrontend.h"
#include "OnnxImporter.h"
#include "PassDetail.h"
#include "Pipeline.h"
#include "SDDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char *kUsage =
    "usage: sdc compile MODEL.onnx|MODEL.onnxtxt -o PLAN.sdp [options]\n"
    "\n"
    "Compiles an ONNX model into a shape-specialized plan for sdrun.\n"
    "\n"
    "options:\n"
    "  -o, --output PLAN.sdp    output plan file (required unless --emit mlir)\n"
    "  --shapes INPUT=DxD[,DxD] static shape of a graph input; repeat the flag or\n"
    "                           give several values to compile several buckets\n"
    "  --dim NAME=N[,N]         value of an ONNX dim_param (symbolic dimension)\n"
    "  --external-weights       write weights to PLAN.safetensors next to the plan\n"
    "  --emit mlir|plan         print the final MLIR instead of writing a plan\n"
    "  --print-ir-after-all     print the IR after every pass (to stderr)\n"
    "  --verbose                print libonnx checker and shape-inference notes\n"
    "  -h, --help               show this help\n";

int fail(const std::string &msg) {
  std::fprintf(stderr, "sdc: error: %s\n", msg.c_str());
  return 1;
}

struct Args {
  std::string model, output, emit = "plan";
  sd::PipelineOptions pipeline;
  bool externalWeights = false, verbose = false;
};

int parseArgs(int argc, char **argv, Args &a) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return -1;
  }
  if (cmd == "--version") {
    std::printf("sdc %s\n", SD_VERSION);
    return -1;
  }
  if (cmd != "compile") return fail("unknown command '" + cmd + "' (try: sdc compile --help)"), 2;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string &out) -> bool {
      size_t eq = arg.find('=');
      if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
        out = arg.substr(eq + 1);
        return true;
      }
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    std::string flag = arg.substr(0, arg.find('='));
    std::string v;
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return -1;
    } else if (flag == "-o" || flag == "--output") {
      if (!value(a.output)) return fail(flag + " needs a value"), 2;
    } else if (flag == "--shapes") {
      if (!value(v)) return fail("--shapes needs INPUT=DxD"), 2;
      a.pipeline.shapes.push_back(v);
    } else if (flag == "--dim") {
      if (!value(v)) return fail("--dim needs NAME=N"), 2;
      a.pipeline.dims.push_back(v);
    } else if (flag == "--emit") {
      if (!value(a.emit) || (a.emit != "mlir" && a.emit != "plan"))
        return fail("--emit takes 'mlir' or 'plan'"), 2;
    } else if (arg == "--external-weights") {
      a.externalWeights = true;
    } else if (arg == "--print-ir-after-all") {
      a.pipeline.printIrAfterAll = true;
    } else if (arg == "--verbose") {
      a.verbose = true;
    } else if (!arg.empty() && arg[0] == '-') {
      return fail("unknown option '" + arg + "' (see sdc compile --help)"), 2;
    } else if (a.model.empty()) {
      a.model = arg;
    } else {
      return fail("unexpected argument '" + arg + "'"), 2;
    }
  }
  if (a.model.empty()) return fail("no model given (see sdc compile --help)"), 2;
  if (a.emit == "plan" && a.output.empty()) return fail("no output given: use -o PLAN.sdp"), 2;
  return 0;
}

// Config recorded in the plan so `sdrun inspect` can say how it was built.
std::string configJson(const Args &a) {
  auto list = [](const std::vector<std::string> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::string("\"") + v[i] + "\"";
    return s + "]";
  };
  return "{\"shapes\":" + list(a.pipeline.shapes) + ",\"dims\":" + list(a.pipeline.dims) +
         ",\"external_weights\":" + (a.externalWeights ? "true" : "false") + "}";
}

} // namespace

int main(int argc, char **argv) {
  Args args;
  if (int rc = parseArgs(argc, argv, args)) return rc < 0 ? 0 : rc;

  sd::LoadedModel loaded;
  std::string error;
  if (!sd::loadOnnxModel(args.model, loaded, error)) return fail(error);
  if (args.verbose)
    for (auto &n : loaded.notes) std::fprintf(stderr, "sdc: note: %s\n", n.c_str());

  mlir::MLIRContext ctx;
  ctx.loadDialect<sd::ir::SDDialect, mlir::func::FuncDialect>();
  // Report the first diagnostic as one line naming the node (its location).
  std::string firstError;
  mlir::ScopedDiagnosticHandler handler(&ctx, [&](mlir::Diagnostic &d) {
    if (d.getSeverity() == mlir::DiagnosticSeverity::Error && firstError.empty()) {
      std::string node = sd::nodeNameOf(d.getLocation());
      firstError = d.str();
      if (!node.empty() && firstError.find(node) == std::string::npos) firstError = "node '" + node + "': " + firstError;
    }
    return mlir::success();
  });

  sd::ImportOptions iopts;
  iopts.modelPath = args.model;
  auto module = sd::importOnnxModel(&ctx, loaded.model, iopts, error);
  if (!module) return fail(error);

  mlir::PassManager pm(&ctx);
  if (args.pipeline.printIrAfterAll) {
    ctx.disableMultithreading();
    pm.enableIRPrinting([](mlir::Pass *, mlir::Operation *) { return false; },
                        [](mlir::Pass *, mlir::Operation *) { return true; }, true, false, false, llvm::errs());
  }
  sd::buildTensorPipeline(pm, args.pipeline);
  sd::buildPlanPipeline(pm);
  if (mlir::failed(pm.run(*module))) return fail(args.model + ": " + (firstError.empty() ? "compilation failed" : firstError));

  if (args.emit == "mlir") {
    module->print(llvm::outs());
    llvm::outs() << "\n";
    return 0;
  }
  sd::EmitOptions eopts;
  eopts.outputPath = args.output;
  eopts.externalWeights = args.externalWeights;
  eopts.producer = std::string("sdc ") + SD_VERSION;
  eopts.sourceSha256 = loaded.sha256;
  eopts.config = configJson(args);
  if (mlir::failed(sd::emitPlan(*module, eopts, error))) return fail(error);
  return 0;
}
