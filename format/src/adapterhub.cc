// AdapterHub's bottleneck adapter layout (its `adapters` library): the
// adapter_config.json it writes and reads, and the plan config's
// "bottleneck" section that sdc compile --peft bottleneck records.
#include "sd/format/json.h"
#include "sd/format/peft.h"
#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

namespace sd {

namespace {

// AdapterHub's SeqBnConfig (Pfeiffer), DoubleSeqBnConfig (Houlsby) and ParBnConfig.
constexpr BottleneckDefaults kConfigs[] = {
    {"seq_bn", "relu", "bert", false, true, false, 16, 1.0},
    {"double_seq_bn", "swish", "bert", true, false, false, 16, 1.0},
    {"par_bn", "relu", "mam_adapter", false, false, true, 2, 4.0},
};

bool flag(const Json &c, const char *key, bool fallback) {
  const Json *v = c.get(key);
  return v && v->type == Json::Type::Bool ? v->b : fallback;
}

std::string lower(std::string s) {
  for (char &ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// A float as Python reads it back as a float: AdapterHub takes only a float
// `scaling` as a factor ("1" would be an unknown scaling type).
std::string floatText(double v) {
  std::string s = jsonNumber(v);
  return s.find_first_of(".eE") == std::string::npos ? s + ".0" : s;
}

std::string intList(const std::vector<int64_t> &v) {
  std::string s;
  for (int64_t i : v) s += (s.empty() ? "" : ", ") + std::to_string(i);
  return "[" + s + "]";
}

Status readLeaveOut(const Json &c, const std::string &where, std::vector<int64_t> &out) {
  const Json *v = c.get("leave_out");
  if (!v || v->type == Json::Type::Null) return Status::ok();
  if (v->type != Json::Type::Array) return sdError(where, ": 'leave_out' must be a list of layer numbers");
  for (const Json &i : v->arr) {
    if (!i.isInteger() || i.num < 0) return sdError(where, ": 'leave_out' must be a list of layer numbers");
    out.push_back(int64_t(i.num));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return Status::ok();
}

} // namespace

const BottleneckDefaults *bottleneckDefaults(const std::string &config) {
  for (const BottleneckDefaults &d : kConfigs)
    if (config == d.name) return &d;
  return nullptr;
}

bool isAdapterHubConfig(const Json &doc) {
  const Json *config = doc.get("config"), *name = doc.get("name");
  return !doc.get("peft_type") && config && config->type == Json::Type::Object && name &&
         name->type == Json::Type::String;
}

StatusOr<LoraConfig> parseAdapterHubConfig(const Json &doc, const std::string &path) {
  const Json &c = *doc.get("config");
  LoraConfig out;
  out.peftType = "BOTTLENECK";
  out.adapterName = doc.get("name")->str;
  if (out.adapterName.empty() || out.adapterName.find('.') != std::string::npos)
    return sdError(path, ": 'name' must be a non-empty adapter name without dots");
  if (const Json *arch = c.get("architecture"); arch && arch->type == Json::Type::String && arch->str != "bottleneck")
    return sdError(path, ": an AdapterHub '", arch->str, "' adapter; sdc reads bottleneck adapters only");
  // What changes the computation beyond the three configurations sdc builds.
  static const std::pair<const char *, const char *> kRefused[] = {
      {"ln_before", "a LayerNorm before the bottleneck"}, {"ln_after", "a LayerNorm after the bottleneck"},
      {"phm_layer", "PHM (Compacter) layers"}, {"cross_adapter", "cross-attention adapters"},
  };
  for (auto &[key, what] : kRefused)
    if (flag(c, key, false)) return sdError(path, ": '", key, "' is set: ", what, " not supported yet");
  if (!flag(c, "output_adapter", true))
    return sdError(path, ": 'output_adapter' is false: sdc's bottleneck adapters always sit after the feed-forward block");
  if (!flag(c, "original_ln_after", true))
    return sdError(path, ": 'original_ln_after' is false: not supported (the residual is always added back)");
  if (const Json *inv = c.get("inv_adapter"); inv && inv->type != Json::Type::Null)
    return sdError(path, ": 'inv_adapter' is set: invertible adapters are not supported");
  if (const Json *depth = c.get("stochastic_depth"); depth && depth->type == Json::Type::Number && depth->num != 0)
    return sdError(path, ": 'stochastic_depth' is set: not supported");
  bool parallel = flag(c, "is_parallel", false), mh = flag(c, "mh_adapter", false),
       lnBefore = flag(c, "original_ln_before", false);
  if (parallel && !mh) out.bottleneckConfig = "par_bn";
  else if (!parallel && !mh && lnBefore) out.bottleneckConfig = "seq_bn";
  else if (!parallel && mh && !lnBefore) out.bottleneckConfig = "double_seq_bn";
  else
    return sdError(path, ": mh_adapter ", mh ? "true" : "false", ", original_ln_before ", lnBefore ? "true" : "false",
                   ", is_parallel ", parallel ? "true" : "false",
                   ": not one of the configurations sdc builds (seq_bn, double_seq_bn, par_bn)");
  if (out.bottleneckConfig == "seq_bn") {
    const Json *r = c.get("residual_before_ln");
    if (r && !(r->type == Json::Type::Bool && r->b))
      return sdError(path, ": 'residual_before_ln' is not true: not supported with original_ln_before");
  }
  const Json *rf = c.get("reduction_factor"), *act = c.get("non_linearity"), *scaling = c.get("scaling"),
             *init = c.get("init_weights"), *hidden = doc.get("hidden_size");
  if (!rf || rf->type != Json::Type::Number || !(rf->num > 0) || !std::isfinite(rf->num))
    return sdError(path, ": 'reduction_factor' must be a positive number (a per-layer mapping is not supported yet)");
  out.reductionFactor = rf->num;
  if (!act || act->type != Json::Type::String) return sdError(path, ": 'non_linearity' must be a string");
  out.nonLinearity = lower(act->str);
  if (scaling && scaling->type == Json::Type::String && (scaling->str == "learned" || scaling->str == "channel"))
    out.scalingKind = scaling->str;
  else if (scaling && scaling->type != Json::Type::Number)
    return sdError(path, ": 'scaling' must be a number, \"learned\" or \"channel\"");
  out.scaling = scaling && scaling->type == Json::Type::Number ? scaling->num : 1.0;
  out.useGating = flag(c, "use_gating", false);
  if (!std::isfinite(out.scaling)) return sdError(path, ": 'scaling' must be a finite number");
  out.initWeights = init && init->type == Json::Type::String ? init->str : "bert";
  if (hidden && hidden->isInteger()) out.hiddenSize = int64_t(hidden->num);
  SD_RETURN_IF_ERROR(readLeaveOut(c, path, out.leaveOut));
  if (const Json *head = doc.get("sdc_modules_to_save"); head && head->type != Json::Type::Null) {
    if (head->type != Json::Type::Array) return sdError(path, ": 'sdc_modules_to_save' must be a list of module names");
    for (const Json &m : head->arr) {
      if (m.type != Json::Type::String) return sdError(path, ": 'sdc_modules_to_save' must be a list of module names");
      out.modulesToSave.push_back(m.str);
    }
  }
  return out;
}

StatusOr<LoraConfig> bottleneckFromPlanConfig(const Json &s) {
  const Json *config = s.get("config"), *rf = s.get("reduction_factor"), *act = s.get("non_linearity"),
             *scaling = s.get("scaling"), *init = s.get("init_weights"), *places = s.get("places"),
             *hidden = s.get("hidden_size");
  if (!config || !bottleneckDefaults(config->str) || !rf || rf->type != Json::Type::Number || !act || !scaling ||
      scaling->type != Json::Type::Number || !places || places->type != Json::Type::Array || !hidden ||
      !hidden->isInteger())
    return sdError("the plan's bottleneck adapter configuration is malformed");
  LoraConfig c;
  c.peftType = "BOTTLENECK";
  c.bottleneckConfig = config->str;
  c.reductionFactor = rf->num;
  c.nonLinearity = act->str;
  c.scaling = scaling->num;
  if (const Json *kind = s.get("scaling_kind"); kind && kind->type == Json::Type::String) c.scalingKind = kind->str;
  c.useGating = flag(s, "use_gating", false);
  c.initWeights = init ? init->str : "bert";
  c.hiddenSize = int64_t(hidden->num);
  for (const Json &p : places->arr) c.modules.push_back(p.str);
  SD_RETURN_IF_ERROR(readLeaveOut(s, "the plan's bottleneck adapter configuration", c.leaveOut));
  return c;
}

std::string adapterHubConfigJson(const LoraConfig &cfg) {
  const BottleneckDefaults &d = *bottleneckDefaults(cfg.bottleneckConfig);
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  // Every field AdapterHub 1.x writes for a BnConfig, so it loads as its own.
  std::vector<std::pair<std::string, std::string>> fields = {
      {"adapter_residual_before_ln", "false"}, {"cross_adapter", "false"}, {"dropout", "0.0"},
      {"factorized_phm_W", "true"}, {"factorized_phm_rule", "false"},
      {"hypercomplex_nonlinearity", "\"glorot-uniform\""}, {"init_weights", jsonQuote(cfg.initWeights)},
      {"init_weights_seed", "null"}, {"inv_adapter", "null"}, {"inv_adapter_reduction_factor", "null"},
      {"is_parallel", b(d.isParallel)}, {"learn_phm", "true"}, {"leave_out", intList(cfg.leaveOut)},
      {"ln_after", "false"}, {"ln_before", "false"}, {"mh_adapter", b(d.mhAdapter)},
      {"non_linearity", jsonQuote(cfg.nonLinearity)}, {"original_ln_after", "true"},
      {"original_ln_before", b(d.originalLnBefore)}, {"output_adapter", "true"}, {"phm_bias", "true"},
      {"phm_c_init", "\"normal\""}, {"phm_dim", "4"}, {"phm_init_range", "0.0001"}, {"phm_layer", "false"},
      {"phm_rank", "1"}, {"reduction_factor", jsonNumber(cfg.reductionFactor)}, {"residual_before_ln", "true"},
      {"scaling", cfg.scalingKind.empty() ? floatText(cfg.scaling) : jsonQuote(cfg.scalingKind)},
      {"shared_W_phm", "false"}, {"shared_phm_rule", "true"}, {"stochastic_depth", "0.0"},
      {"use_gating", b(cfg.useGating)},
  };
  std::string json = "{\n  \"config\": {\n";
  for (size_t i = 0; i < fields.size(); ++i)
    json += "    " + jsonQuote(fields[i].first) + ": " + fields[i].second + (i + 1 < fields.size() ? ",\n" : "\n");
  // A classification plan's head travels in the same file, keyed by its own
  // names; AdapterHub keeps heads apart, and its load_adapter skips them.
  std::string head;
  for (const std::string &m : cfg.modulesToSave) head += (head.empty() ? "" : ", ") + jsonQuote(m);
  if (!head.empty()) head = ",\n  \"sdc_modules_to_save\": [" + head + "]";
  return json + "  }" + head + ",\n  \"hidden_size\": " + std::to_string(cfg.hiddenSize) +
         ",\n  \"model_class\": \"\",\n  \"model_name\": \"\",\n  \"model_type\": \"\",\n  \"name\": " +
         jsonQuote(cfg.adapterName) + ",\n  \"version\": \"adapters.1.3.0\"\n}\n";
}

std::string bottleneckMismatch(const LoraConfig &given, const LoraConfig &plan) {
  auto num = [](double v) { return jsonNumber(v); };
  if (given.bottleneckConfig != plan.bottleneckConfig)
    return "the adapter is " + given.bottleneckConfig + ", the plan " + plan.bottleneckConfig +
           " (sdc compile --bottleneck-config)";
  // AdapterHub sizes the bottleneck as int(hidden // reduction_factor).
  auto size = [&](double rf) { return int64_t(std::floor(double(plan.hiddenSize) / rf)); };
  if (size(given.reductionFactor) != size(plan.reductionFactor))
    return "reduction_factor " + num(given.reductionFactor) + ", the plan's " + num(plan.reductionFactor) +
           " (sdc compile --reduction-factor)";
  std::string a = given.nonLinearity == "silu" ? "swish" : given.nonLinearity,
              b = plan.nonLinearity == "silu" ? "swish" : plan.nonLinearity;
  if (a != b) return "non_linearity '" + given.nonLinearity + "', the plan's '" + plan.nonLinearity + "' (sdc compile --non-linearity)";
  auto scaling = [&](const LoraConfig &c) { return c.scalingKind.empty() ? num(c.scaling) : c.scalingKind; };
  if (given.scalingKind != plan.scalingKind || (plan.scalingKind.empty() && given.scaling != plan.scaling))
    return "scaling " + scaling(given) + ", the plan's " + scaling(plan) + " (sdc compile --adapter-scaling)";
  if (given.useGating != plan.useGating)
    return std::string("use_gating ") + (given.useGating ? "true" : "false") + ", the plan's " +
           (plan.useGating ? "true" : "false") + " (sdc compile --use-gating)";
  if (given.leaveOut != plan.leaveOut)
    return "leave_out " + intList(given.leaveOut) + ", the plan's " + intList(plan.leaveOut) +
           " (sdc compile --leave-out)";
  return "";
}

} // namespace sd
