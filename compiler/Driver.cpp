// The compile driver: load, import, run the pipeline, emit.
#include "Driver.h"
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
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
#include "sd/format/json.h"
#include "sd/format/row_shard.h"
#include "sd/format/training_abi.h"

namespace sd {

// A preference plan's method and its settings (plan config "preference").
static std::string preferenceJson(const PipelineOptions &p) {
  std::string json = "{\"method\":" + jsonQuote(p.recipe) + ",\"beta\":" + jsonNumber(p.beta);
  if (p.recipe == "dpo") json += ",\"loss_type\":" + jsonQuote(p.dpoLoss);
  if (p.recipe == "simpo") json += ",\"simpo_gamma\":" + jsonNumber(p.simpoGamma) + ",\"cpo_alpha\":" + jsonNumber(p.cpoAlpha);
  if (p.recipe == "kto")
    json += ",\"desirable_weight\":" + jsonNumber(p.desirableWeight) + ",\"undesirable_weight\":" +
            jsonNumber(p.undesirableWeight);
  if (p.grpo())
    json += ",\"num_generations\":" + std::to_string(p.numGenerations) + ",\"loss_type\":" + jsonQuote(p.grpoLoss) +
            ",\"epsilon\":" + jsonNumber(p.grpoEpsilon) +
            ",\"epsilon_high\":" + jsonNumber(p.grpoEpsilonHigh < 0 ? p.grpoEpsilon : p.grpoEpsilonHigh) +
            (p.grpoDelta > 0 ? ",\"delta\":" + jsonNumber(p.grpoDelta) : std::string()) +
            ",\"importance_sampling_level\":" + jsonQuote(p.importanceSampling) +
            ",\"scale_rewards\":" + jsonQuote(p.scaleRewards) +
            ",\"max_completion_length\":" + std::to_string(p.maxCompletionLength) +
            (p.samplingLogProbs ? ",\"sampling_log_probs\":true" : "");
  return json + "}";
}

static std::string configJson(const CompileRequest &r) {
  auto list = [](const std::vector<std::string> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + jsonQuote(v[i]);
    return s + "]";
  };
  return "{\"shapes\":" + list(r.pipeline.shapes) + ",\"dims\":" + list(r.pipeline.dims) +
         ",\"external_weights\":" + (r.externalWeights ? "true" : "false") +
         (r.pipeline.precision != "fp32" ? ",\"precision\":" + jsonQuote(r.pipeline.precision) : std::string()) +
         (r.pipeline.training() ? ",\"peft\":" + jsonQuote(r.pipeline.peft) + ",\"recipe\":" + jsonQuote(r.pipeline.recipe) +
                                      ",\"optimizer\":" + jsonQuote(r.pipeline.optimizer) +
                                      (r.pipeline.packing ? ",\"packing\":true" : "") +
                                      (r.pipeline.preference() || r.pipeline.grpo() ? ",\"preference\":" + preferenceJson(r.pipeline) : "") +
                                      (r.pipeline.lossOutput.empty() ? ""
                                                                     : ",\"loss_output\":" + jsonQuote(r.pipeline.lossOutput)) +
                                      (r.pipeline.shard != "none" ? ",\"shard\":" + jsonQuote(r.pipeline.shard) : "")
                                : std::string()) +
         "}";
}

// An array of strings as a JSON list: ["a","b"].
static std::string jsonStrings(mlir::ArrayAttr strings) {
  std::string list = "[";
  for (auto [i, n] : llvm::enumerate(strings)) list += (i ? "," : "") + jsonQuote(mlir::cast<mlir::StringAttr>(n).str());
  return list + "]";
}

// The PEFT configuration the passes recorded, as JSON for the plan's config
// (sdrun writes adapter_config.json from it).
static std::string peftJson(mlir::ModuleOp module) {
  auto dict = module->getAttrOfType<mlir::DictionaryAttr>("sd.peft");
  if (!dict) return "";
  std::string s = "{";
  for (mlir::NamedAttribute a : dict) {
    s += (s.size() > 1 ? "," : "") + jsonQuote(a.getName().str()) + ":";
    // BoolAttr is an i1 IntegerAttr (getInt() gives -1): test it first.
    if (auto b = mlir::dyn_cast<mlir::BoolAttr>(a.getValue())) s += b.getValue() ? "true" : "false";
    else if (auto i = mlir::dyn_cast<mlir::IntegerAttr>(a.getValue())) s += std::to_string(i.getInt());
    else if (auto f = mlir::dyn_cast<mlir::FloatAttr>(a.getValue())) {
      char buf[32]; // round-trip precision: sdrun compares lora_alpha with an adapter's
      std::snprintf(buf, sizeof buf, "%.17g", f.getValueAsDouble());
      s += buf;
    }
    else if (auto str = mlir::dyn_cast<mlir::StringAttr>(a.getValue())) s += jsonQuote(str.str());
    else if (auto arr = mlir::dyn_cast<mlir::ArrayAttr>(a.getValue())) {
      s += "[";
      for (size_t k = 0; k < arr.size(); ++k) {
        s += k ? "," : "";
        if (auto i = mlir::dyn_cast<mlir::IntegerAttr>(arr[k])) s += std::to_string(i.getInt());
        else s += jsonQuote(mlir::cast<mlir::StringAttr>(arr[k]).str());
      }
      s += "]";
    }
  }
  return s + "}";
}

// Whether every entry input has a static shape in the model itself (a
// model exported without dynamic axes): the training entries can be built
// without --shapes.
static bool staticInputs(mlir::ModuleOp module) {
  for (auto f : module.getOps<mlir::func::FuncOp>())
    for (mlir::Type t : f.getArgumentTypes())
      if (auto shaped = mlir::dyn_cast<mlir::ShapedType>(t); shaped && !shaped.hasStaticShape()) return false;
  return true;
}

// --dry-run: the matched modules and how many parameters would train.
static std::string dryRunReport(mlir::ModuleOp module, const CompileRequest &req) {
  int64_t trainable = 0, total = 0;
  std::vector<std::string> names;
  int64_t quantized = 0; // values stored as NF4 codes (two a byte)
  for (auto g : module.getOps<ir::GlobalOp>()) {
    auto t = mlir::cast<mlir::RankedTensorType>(g.getType());
    if (g.getSymName().ends_with(".nf4") && t.getElementType().isUnsignedInteger(8)) {
      quantized += 2 * t.getNumElements();
      continue;
    }
    if (g.getSymName().ends_with(".nf4_absmax")) continue; // the codes' scales, not weights
    // Weights only: a dry run that reached the training entries also holds
    // gradients and optimizer state.
    if (!mlir::isa<mlir::FloatType>(t.getElementType()) || (g.getRole() != "trainable" && g.getRole() != "frozen"))
      continue;
    total += t.getNumElements();
    if (g.getRole() == "trainable") trainable += t.getNumElements(), names.push_back(g.getSymName().str());
  }
  std::string out;
  if (auto notes = module->getAttrOfType<mlir::ArrayAttr>("sd.control_flow")) {
    out += "control flow:\n";
    for (mlir::Attribute n : notes) out += "  " + mlir::cast<mlir::StringAttr>(n).str() + "\n";
  }
  if (!req.pipeline.training()) return out.empty() ? "no training and no control flow to report\n" : out;
  auto dict = module->getAttrOfType<mlir::DictionaryAttr>("sd.peft");
  auto type = dict ? dict.getAs<mlir::StringAttr>("peft_type") : mlir::StringAttr();
  if (type && type.getValue() == "OSF") {
    auto mods = dict.getAs<mlir::ArrayAttr>("modules"), ranks = dict.getAs<mlir::ArrayAttr>("ranks");
    auto strategies = dict.getAs<mlir::ArrayAttr>("strategies");
    char head[96];
    std::snprintf(head, sizeof head, "OSFT preserved ratio %g on %zu modules (k frozen, r trainable):\n",
                  req.pipeline.osftRatio, size_t(mods.size()));
    out += head;
    std::map<std::string, int64_t> counts;
    for (auto g : module.getOps<ir::GlobalOp>())
      counts[g.getSymName().str()] = mlir::cast<mlir::RankedTensorType>(g.getType()).getNumElements();
    for (size_t i = 0; i < mods.size(); ++i) {
      std::string m = mlir::cast<mlir::StringAttr>(mods[i]).str();
      int64_t k = mlir::cast<mlir::IntegerAttr>(ranks[i]).getInt(), r = counts[m + ".osf_svd_params.S_low"];
      int64_t params = counts[m + ".osf_svd_params.U_low"] + r + counts[m + ".osf_svd_params.V_low"];
      std::string strategy = strategies ? mlir::cast<mlir::StringAttr>(strategies[i]).str()
                                        : "decided from --shapes";
      out += "  " + m + "  k=" + std::to_string(k) + " r=" + std::to_string(r) + " trainable=" +
             std::to_string(params) + " strategy=" + strategy + "\n";
    }
  } else if (type && type.getValue() == "IA3") {
    auto mods = dict.getAs<mlir::ArrayAttr>("modules");
    std::set<std::string> inputSide;
    for (auto m : dict.getAs<mlir::ArrayAttr>("feedforward").getAsValueRange<mlir::StringAttr>()) inputSide.insert(m.str());
    out += "IA3 on " + std::to_string(mods.size()) + " modules:\n";
    for (auto m : mods.getAsValueRange<mlir::StringAttr>())
      out += "  " + m.str() + (inputSide.count(m.str()) ? "  (feedforward: scales the input)\n" : "  (scales the output)\n");
  } else if (type && type.getValue() == "BOTTLENECK") {
    auto mods = dict.getAs<mlir::ArrayAttr>("modules"), places = dict.getAs<mlir::ArrayAttr>("places");
    char head[200];
    std::snprintf(head, sizeof head, "bottleneck adapters (%s, reduction factor %g, %s, scaling %g) after %zu block%s:\n",
                  dict.getAs<mlir::StringAttr>("config").str().c_str(),
                  dict.getAs<mlir::FloatAttr>("reduction_factor").getValueAsDouble(),
                  dict.getAs<mlir::StringAttr>("non_linearity").str().c_str(),
                  dict.getAs<mlir::FloatAttr>("scaling").getValueAsDouble(), size_t(mods.size()),
                  mods.size() == 1 ? "" : "s");
    out += head;
    for (auto [m, p] : llvm::zip(mods.getAsValueRange<mlir::StringAttr>(), places.getAsValueRange<mlir::StringAttr>()))
      out += "  " + m.str() + "  (" + p.str() + ")\n";
  } else if (type && type.getValue() == "PROMPT_TUNING") {
    auto num = [&](const char *k) { return std::to_string(dict.getAs<mlir::IntegerAttr>(k).getInt()); };
    out += "prompt tuning: " + num("num_virtual_tokens") + " virtual tokens of " + num("token_dim") +
           " values before every row (" + dict.getAs<mlir::StringAttr>("prompt_tuning_init").str() + " start)\n";
  } else if (type && type.getValue() == "PREFIX_TUNING") {
    auto num = [&](const char *k) {
      auto v = dict.getAs<mlir::IntegerAttr>(k);
      return v ? std::to_string(v.getInt()) : std::string("?");
    };
    out += "prefix tuning: keys and values of " + num("num_virtual_tokens") + " virtual tokens in each of " +
           num("num_layers") + " attention layers (" + num("num_attention_heads") + " key/value heads, " +
           num("token_dim") + " values a token)\n";
  } else if (dict) {
    auto mods = dict.getAs<mlir::ArrayAttr>("modules");
    char dropout[48] = "";
    if (req.pipeline.loraDropout > 0) std::snprintf(dropout, sizeof dropout, " dropout=%g", req.pipeline.loraDropout);
    std::string kind = req.pipeline.peft == "adalora" ? "AdaLoRA"
                       : req.pipeline.peft == "loha"   ? "LoHa"
                       : req.pipeline.peft == "dylora" ? "DyLoRA (block size " + std::to_string(req.pipeline.dyloraBlockSize) + ")"
                       : req.pipeline.peft == "lokr" ? "LoKr"
                       : req.pipeline.peft == "vera" ? "VeRA"
                       : req.pipeline.useDora        ? "DoRA"
                                                     : "LoRA";
    out += kind + " r=" + std::to_string(req.pipeline.loraR) + " alpha=" + std::to_string(req.pipeline.loraAlpha) +
           dropout + " on " + std::to_string(mods.size()) + " modules:\n";
    // LoKr: each module's factors (whole, or rank-r products) as PEFT names them.
    auto factors = dict.getAs<mlir::ArrayAttr>("factors");
    for (auto [i, m] : llvm::enumerate(mods))
      out += "  " + mlir::cast<mlir::StringAttr>(m).str() +
             (factors ? "  (" + mlir::cast<mlir::StringAttr>(factors[i]).str() + ")" : std::string()) + "\n";
  } else {
    out += (req.pipeline.peft == "bitfit" ? "BitFit: the bias terms, " : "full fine-tuning of ") +
           std::to_string(names.size()) + " weights:\n";
    for (auto &n : names) out += "  " + n + "\n";
  }
  total += quantized;
  char buf[240];
  std::snprintf(buf, sizeof buf, "trainable parameters: %lld of %lld (%.4f%%)\n", (long long)trainable,
                (long long)total, total ? 100.0 * double(trainable) / double(total) : 0.0);
  out += buf;
  if (quantized) {
    std::snprintf(buf, sizeof buf, "NF4 (--quantize nf4): %lld frozen weight values in 4-bit codes, %.1f MB instead of %.1f\n",
                  (long long)quantized, double(quantized) * 4.5 / 8 / 1e6, double(quantized) * 4 / 1e6);
    out += buf;
  }
  return out;
}

// What an exporter's optimizer did to a model trained in full:
//  - trainable weights that nodes of several modules read in the same role
//    (sd.shared_weights of the importer) train as one tensor, which is what
//    an exporter that merged equal initializers leaves;
//  - parameters the PyTorch model reads that the file lacks
//    (sd.dropped_parameters) cannot train at all, which matters to full
//    fine-tuning (the importer restores what it can: all-zero biases the
//    optimizer removed, parameters it merged with another's); those no node
//    reads (sd.unread_parameters) may be unused, or lost in a merge the file
//    does not tell;
//  - weights the optimizer computed from several parameters, or from one the
//    model also reads itself, by what the importer cannot derive again
//    (sd.folded_weights: weight_norm's g * v / |v|) train apart from them.
static void exportWarnings(mlir::ModuleOp module, const CompileRequest &req, std::vector<std::string> *warnings) {
  if (!warnings) return;
  if (auto count = module->getAttrOfType<mlir::IntegerAttr>("sd.quantized_int4"); count && count.getInt() == 0)
    warnings->push_back("--quantize int4 found no linear layer whose weight is a frozen f32 matrix that only linear "
                        "layers read: the plan's weights stay f32");
  const std::string &model = req.model;
  // "the PyTorch model's parameters 'a', 'b' are" / "parameter 'a' is"
  auto parameters = [&](mlir::ArrayAttr names) {
    std::string list;
    for (auto name : names.getAsValueRange<mlir::StringAttr>()) list += (list.empty() ? "'" : ", '") + name.str() + "'";
    return model + ": the PyTorch model's parameter" + (names.size() > 1 ? "s " : " ") + list +
           (names.size() > 1 ? " are" : " is");
  };
  auto dropped = module->getAttrOfType<mlir::ArrayAttr>("sd.dropped_parameters");
  auto unread = module->getAttrOfType<mlir::ArrayAttr>("sd.unread_parameters");
  if (req.pipeline.peft == "none" || req.pipeline.peft == "bitfit") { // adapters leave the model's own parameters frozen
    if (dropped)
      warnings->push_back(parameters(dropped) +
                          " not in the file (torch.onnx.export's optimizer folds some away, such as all-zero biases) "
                          "and cannot train; export with optimize=False");
    if (auto folded = module->getAttrOfType<mlir::ArrayAttr>("sd.folded_norms")) {
      std::string list;
      for (auto node : folded.getAsValueRange<mlir::StringAttr>()) list += (list.empty() ? "" : ", ") + node.str();
      warnings->push_back(model + ": node" + (folded.size() > 1 ? "s " : " ") + list + (folded.size() > 1 ? " hold" : " holds") +
                          " PyTorch's eval-mode BatchNorm folded in by torch.onnx.export's optimizer: the weights "
                          "there are products with the norm's, frozen, where PyTorch trains both; export with "
                          "optimize=False");
    }
    if (unread)
      warnings->push_back(parameters(unread) +
                          " read by no node of the file: unused by the forward, or tied to another parameter, or "
                          "merged by torch.onnx.export's optimizer into an equal one's node; the saved weights lack "
                          "them (export with optimize=False to be sure)");
  }
  auto shared = module->getAttrOfType<mlir::DictionaryAttr>("sd.shared_weights");
  auto folded = module->getAttrOfType<mlir::DictionaryAttr>("sd.folded_weights");
  for (auto g : module.getOps<ir::GlobalOp>()) {
    if (g.getRole() != "trainable") continue;
    if (auto why = folded ? folded.getAs<mlir::StringAttr>(g.getSymName()) : nullptr)
      warnings->push_back(model + ": weight '" + g.getSymName().str() + "' " + why.str() +
                          "; export with optimize=False");
    auto modules = shared ? shared.getAs<mlir::StringAttr>(g.getSymName()) : nullptr;
    if (!modules) continue;
    warnings->push_back(model + ": weight '" + g.getSymName().str() + "' is read by the modules " + modules.str() +
                        " and trains as one tensor they share; if the exporter merged equal weights "
                        "(torch.onnx.export's optimizer does), export with optimize=False");
  }
}

// A training plan without --shapes or --dim: --dim bindings of the default
// batch and sequence sizes for the entry inputs' named dynamic dims that look
// like them (Optimum's batch_size and sequence_length, torch.onnx's batch and
// seq; not a past length, nor a sum of dims, which follows from its parts).
static std::vector<std::string> defaultDims(mlir::ModuleOp module, int64_t batch, int64_t seq) {
  std::vector<std::string> dims;
  std::set<std::string> seen;
  for (auto f : module.getOps<mlir::func::FuncOp>())
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      auto params = f.getArgAttrOfType<mlir::ArrayAttr>(i, "sd.dim_params");
      auto shaped = mlir::dyn_cast<mlir::ShapedType>(f.getArgumentTypes()[i]);
      if (!params || !shaped || !shaped.hasRank()) continue;
      for (auto [d, p] : llvm::enumerate(params)) {
        auto name = mlir::dyn_cast<mlir::StringAttr>(p);
        if (!name || d >= size_t(shaped.getRank()) || !shaped.isDynamicDim(int64_t(d))) continue;
        std::string n = name.str(), lower = llvm::StringRef(n).lower();
        if (lower.find('+') != std::string::npos || lower.find("past") != std::string::npos || !seen.insert(n).second)
          continue;
        if (batch > 0 && lower.find("batch") != std::string::npos) dims.push_back(n + "=" + std::to_string(batch));
        else if (seq > 0 && lower.find("seq") != std::string::npos) dims.push_back(n + "=" + std::to_string(seq));
      }
    }
  return dims;
}

bool compileModel(const CompileRequest &given, std::string &error, std::string *irOut,
                  std::vector<std::string> *warnings) {
  CompileRequest req = given; // the default dims join the given options below
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
  iopts.maxTrip = req.maxTrip;
  iopts.maxUnroll = req.maxUnroll;
  iopts.maxSelect = req.maxSelect;
  iopts.training = req.pipeline.training();
  for (const std::string &spec : req.pipeline.shapes) {
    std::string name, err;
    std::vector<std::vector<int64_t>> buckets;
    if (failed(parseBinding(spec, /*isShape=*/true, name, buckets, err))) return error = req.model + ": " + err, false;
    iopts.inputRanks[name] = int64_t(buckets[0].size());
    // An inference plan of one bucket: the shapes are the model's from the start.
    if (!req.pipeline.training() && req.pipeline.inferShapes.empty() && buckets.size() == 1 && !buckets[0].empty())
      iopts.inputShapes[name] = buckets[0];
  }
  std::vector<onnx::TensorProto> bound(req.binds.size());
  for (size_t i = 0; i < req.binds.size(); ++i) {
    if (!loadTensorProto(req.binds[i].second, bound[i], error)) return false;
    iopts.bindings[req.binds[i].first] = &bound[i];
  }
  auto module = importOnnxModel(&ctx, loaded.model, iopts, error);
  if (!module) return false;
  if (req.pipeline.training() && req.pipeline.shapes.empty() && req.pipeline.dims.empty() && !staticInputs(*module)) {
    req.pipeline.dims = defaultDims(*module, req.pipeline.defaultBatch, req.pipeline.defaultSeq);
    std::string list;
    for (const std::string &d : req.pipeline.dims) list += " --dim " + d;
    if (!list.empty() && warnings)
      warnings->push_back("no --shapes or --dim: a training plan's default bucket," + list +
                          " (give --shapes or --dim to choose)");
  }
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
  if (req.dryRun) {
    // With --shapes (or a model of static inputs) the dry run goes as far as
    // the training entries: OSFT's strategy depends on the tokens per step,
    // and full fine-tuning leaves frozen the weights no gradient reaches
    // (rotary tables, masks, a loss's class weights).
    if (req.pipeline.training() && req.pipeline.peft != "lora" && req.pipeline.peft != "ia3" &&
        req.pipeline.peft != "loha" && req.pipeline.peft != "dylora" && req.pipeline.peft != "lokr" && req.pipeline.peft != "vera" && req.pipeline.peft != "prompt" &&
        req.pipeline.peft != "adalora" && req.pipeline.peft != "bottleneck" && req.pipeline.peft != "bitfit" &&
        (!req.pipeline.shapes.empty() || staticInputs(*module)))
      buildTensorPipeline(pm, req.pipeline);
    else buildPeftPipeline(pm, req.pipeline);
    if (mlir::failed(pm.run(*module))) {
      error = req.model + ": " + (firstError.empty() ? "compilation failed" : firstError);
      return false;
    }
    exportWarnings(*module, req, warnings);
    if (irOut) *irOut = dryRunReport(*module, req);
    return true;
  }
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
  exportWarnings(*module, req, warnings);
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
  eopts.files = req.files;
  // What the passes decided joins the request's fields in the same object.
  auto addField = [&](const char *key, const std::string &json) {
    eopts.config = eopts.config.substr(0, eopts.config.size() - 1) + ",\"" + key + "\":" + json + "}";
  };
  if (auto token = (*module)->getAttrOfType<mlir::StringAttr>("sd.token_input")) addField("token_input", jsonQuote(token.str()));
  if (auto rows = (*module)->getAttrOfType<mlir::ArrayAttr>("sd.row_sharded"))
    addField(abi::kRowShardedConfigKey, jsonStrings(rows));
  if (auto notes = (*module)->getAttrOfType<mlir::ArrayAttr>("sd.control_flow")) {
    // The import's decisions, and how many run-time selects specialization left.
    int64_t selects = 0;
    module->walk([&](ir::IfSelectOp) { ++selects; });
    addField("control_flow", "{\"decisions\":" + jsonStrings(notes) + ",\"run_time_selects\":" + std::to_string(selects) + "}");
  }
  if (auto cls = (*module)->getAttrOfType<mlir::DictionaryAttr>("sd.classify")) {
    auto num = [&](const char *k) { return std::to_string(mlir::cast<mlir::IntegerAttr>(cls.get(k)).getInt()); };
    addField("classify", std::string("{\"num_labels\":") + num("num_labels") + ",\"vocab\":" + num("vocab") +
                             ",\"pooling\":" + jsonQuote(mlir::cast<mlir::StringAttr>(cls.get("pooling")).str()) + "}");
  }
  if (auto tied = (*module)->getAttrOfType<mlir::DictionaryAttr>("sd.tied_names")) {
    // The other names of tied parameters: sdrun saves trained weights under each.
    std::string map = "{";
    for (mlir::NamedAttribute a : tied)
      map += (map.size() > 1 ? "," : "") + jsonQuote(a.getName().str()) + ":" +
             jsonStrings(mlir::cast<mlir::ArrayAttr>(a.getValue()));
    addField(abi::kTiedNamesConfigKey, map + "}");
  }
  if (std::string peft = peftJson(*module); !peft.empty())
    addField(peft.find("\"OSF\"") != std::string::npos   ? "osf"
             : peft.find("\"IA3\"") != std::string::npos ? "ia3"
             : peft.find("\"LOHA\"") != std::string::npos ? "loha"
             : peft.find("\"DYLORA\"") != std::string::npos ? "dylora"
             : peft.find("\"LOKR\"") != std::string::npos ? "lokr"
             : peft.find("\"VERA\"") != std::string::npos ? "vera"
             : peft.find("\"PROMPT_TUNING\"") != std::string::npos ? "prompt_tuning"
             : peft.find("\"PREFIX_TUNING\"") != std::string::npos ? "prefix_tuning"
             : peft.find("\"ADALORA\"") != std::string::npos ? "adalora"
             : peft.find("\"BOTTLENECK\"") != std::string::npos ? "bottleneck"
                                                          : "lora",
             peft);
  return mlir::succeeded(emitPlan(*module, eopts, error));
}

} // namespace sd
