// PEFT's LoRA adapter layout: key naming, adapter_config.json reading and
// writing, and the LoRA section of a plan's config JSON.
#include "sd/format/peft.h"
#include "sd/format/json.h"
#include "sd/format/tensor_io.h"
#include <algorithm>
#include <cstdio>
#include <cstring>

namespace sd {

std::string adapterKey(const std::string &name) {
  if (name == kPromptEmbeddings) return name;
  for (const char *shared : kVeraProjections)
    if (name == shared) return std::string("base_model.") + name;
  return kAdapterKeyPrefix + name;
}

std::string LoraConfig::key(const std::string &name) const {
  if (isBottleneck()) { // AdapterHub's keys are the model's parameter names, with the adapter's own name
    const std::string planName = std::string(".adapters.") + kBottleneckName + ".";
    size_t at = name.find(planName);
    return at == std::string::npos ? name
                                   : name.substr(0, at) + ".adapters." + adapterName + "." + name.substr(at + planName.size());
  }
  const std::string suffix = ".bias";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    std::string module = name.substr(0, name.size() - suffix.size());
    if (std::find(modules.begin(), modules.end(), module) != modules.end())
      return adapterKey(module + ".base_layer.bias");
  }
  return adapterKey(name);
}

std::vector<std::string> LoraConfig::tensorNames(const std::string &module) const {
  if (isIa3()) return {module + kIa3Suffix};
  if (isBottleneck()) {
    std::vector<std::string> names;
    const std::string adapter = module + ".adapters." + kBottleneckName;
    for (const char *suffix : kBottleneckSuffixes) names.push_back(adapter + suffix);
    if (!scalingKind.empty()) names.push_back(adapter + ".scaling");
    if (useGating)
      for (const char *part : {".gate.weight", ".gate.bias"}) names.push_back(adapter + part);
    return names;
  }
  if (isVera()) return {module + kVeraSuffixes[0], module + kVeraSuffixes[1]};
  if (isLoha()) return {module + kLohaSuffixes[0], module + kLohaSuffixes[1], module + kLohaSuffixes[2], module + kLohaSuffixes[3]};
  if (isLokr()) {
    std::vector<std::string> names;
    for (size_t i = 0; i < modules.size() && i < factors.size(); ++i) {
      if (modules[i] != module) continue;
      for (size_t start = 0; start <= factors[i].size();) {
        size_t comma = std::min(factors[i].find(',', start), factors[i].size());
        if (comma > start) names.push_back(module + "." + factors[i].substr(start, comma - start));
        start = comma + 1;
      }
    }
    return names;
  }
  if (isOsf()) return {module + kOsfSuffixes[0], module + kOsfSuffixes[1], module + kOsfSuffixes[2]};
  if (isAdalora()) return {module + kAdaloraSuffixes[0], module + kAdaloraSuffixes[1], module + kAdaloraSuffixes[2]};
  if (useDora) return {module + kLoraASuffix, module + kLoraBSuffix, module + kDoraMagnitudeSuffix};
  return {module + kLoraASuffix, module + kLoraBSuffix};
}

bool LoraConfig::feedforwardByRule(const std::string &module) const {
  for (const std::string &e : feedforwardEndings)
    if (module.size() >= e.size() && module.compare(module.size() - e.size(), e.size(), e) == 0) return true;
  return false;
}

std::string LoraConfig::kindName() const {
  return isOsf()            ? "OSF"
         : isIa3()          ? "IA3"
         : isLoha()         ? "LoHa"
         : isLokr()         ? "LoKr"
         : isVera()         ? "VeRA"
         : isPromptTuning() ? "prompt tuning"
         : isPrefixTuning() ? "prefix tuning"
         : isAdalora()      ? "AdaLoRA"
         : isBottleneck()   ? "bottleneck adapter (" + bottleneckConfig + ")"
         : isDylora()       ? "DyLoRA"
         : useDora          ? "DoRA"
                            : "LoRA";
}

std::string LoraConfig::compileFlags() const {
  return isOsf()    ? "--peft osft"
         : isIa3()  ? "--peft ia3"
         : isLoha() ? "--peft loha"
         : isLokr() ? "--peft lokr"
         : isVera() ? "--peft vera"
         : isPromptTuning() ? "--peft prompt"
         : isPrefixTuning() ? (prefixProjection ? "--peft prefix --prefix-projection" : "--peft prefix")
         : isAdalora() ? "--peft adalora"
         : isBottleneck() ? "--peft bottleneck --bottleneck-config " + bottleneckConfig
         : isDylora() ? "--peft dylora --dylora-block-size " + std::to_string(dyloraBlockSize)
         : useDora  ? "--peft lora --use-dora"
         : baseInit.empty() ? "--peft lora"
                            : "--peft lora --lora-init " + baseInit;
}

std::vector<std::pair<std::string, std::string>> LoraConfig::tensors() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string &m : modulesToSave)
    for (const char *suffix : {".weight", ".bias"}) out.push_back({m, m + suffix});
  if (isVera() && saveProjection)
    for (const char *shared : kVeraProjections) out.push_back({"", shared});
  if (isPromptTuning() || isPrefixTuning()) out.push_back({"", kPromptEmbeddings});
  for (const std::string &b : trainedBiases) out.push_back({"", b});
  for (const std::string &m : modules)
    for (const std::string &name : tensorNames(m)) out.push_back({m, name});
  return out;
}

namespace {

// modules_to_save: null or a list of module names.
Status readModulesToSave(const Json &doc, const std::string &path, std::vector<std::string> &out) {
  const Json *save = doc.get("modules_to_save");
  if (!save || save->type == Json::Type::Null) return Status::ok();
  if (save->type != Json::Type::Array) return sdError(path, ": 'modules_to_save' must be a list of module names");
  for (const Json &m : save->arr) {
    if (m.type != Json::Type::String) return sdError(path, ": 'modules_to_save' must be a list of module names");
    out.push_back(m.str);
  }
  return Status::ok();
}

// Fields of PEFT's LoraConfig that change what the adapter computes in ways
// sdc does not implement: loading such an adapter must fail, not silently give
// a different model. (Fields that only steer training or naming are ignored.)
Status refuseUnsupportedSemantics(const Json &doc, const std::string &path) {
  auto isSet = [&](const char *key) {
    const Json *v = doc.get(key);
    if (!v) return false;
    switch (v->type) {
    case Json::Type::Null: return false;
    case Json::Type::Bool: return v->b;
    case Json::Type::Array: return !v->arr.empty();
    case Json::Type::Object: return !v->obj.empty();
    case Json::Type::String: return !v->str.empty();
    default: return true;
    }
  };
  static const std::pair<const char *, const char *> kRefused[] = {
      {"lora_bias", "LoRA bias terms (lora_bias) are not supported yet"},
      {"use_qalora", "QALoRA is not supported yet"},
      {"rank_pattern", "per-module ranks (rank_pattern) are not supported yet"},
      {"alpha_pattern", "per-module alphas (alpha_pattern) are not supported yet"},
      {"layer_replication", "layer replication is not supported"},
      {"target_parameters", "LoRA on bare parameters (target_parameters) is not supported yet"},
      {"trainable_token_indices", "trainable token embeddings (trainable_token_indices) are not supported yet"},
      {"alora_invocation_tokens", "activated LoRA (alora_invocation_tokens) is not supported"},
      {"arrow_config", "Arrow routing (arrow_config) is not supported"},
      {"use_bdlora", "block-diagonal LoRA (use_bdlora) is not supported"},
  };
  for (auto &[key, why] : kRefused)
    if (isSet(key)) return sdError(path, ": '", key, "' is set: ", why);
  if (const Json *bias = doc.get("bias");
      bias && bias->type == Json::Type::String && bias->str != "none" && bias->str != "all" && bias->str != "lora_only")
    return sdError(path, ": 'bias' is '", bias->str, "': PEFT's bias is none, all or lora_only");
  // These initializations rewrite the base weights too. PiSSA, OLoRA and
  // LoftQ's rewrites are computed from the base weight alone, as sdc does
  // (readBaseInit); the others' need the training data or random draws.
  if (const Json *init = doc.get("init_lora_weights"); init && init->type == Json::Type::String)
    for (const char *rewrites : {"pissa_niter", "corda", "eva", "lora_ga"})
      if (init->str.rfind(rewrites, 0) == 0)
        return sdError(path, ": 'init_lora_weights' is '", init->str, "', which changes the base weights in a way ",
                       "sdc cannot rebuild; convert the adapter to plain LoRA with PEFT ",
                       "(path_initial_model_for_weight_conversion) first");
  return Status::ok();
}

// init_lora_weights "pissa", "olora" or "loftq" (with loftq_config's 4 bits
// and loftq_iter rounds): the adapter fits the base weights they leave.
Status readBaseInit(const Json &doc, const std::string &path, LoraConfig &c) {
  const Json *init = doc.get("init_lora_weights");
  if (!init || init->type != Json::Type::String) return Status::ok();
  if (init->str != "pissa" && init->str != "olora" && init->str != "loftq") return Status::ok(); // A, B only
  c.baseInit = init->str;
  if (c.baseInit != "loftq") return Status::ok();
  const Json *loftq = doc.get("loftq_config");
  const Json *bits = loftq ? loftq->get("loftq_bits") : nullptr, *iter = loftq ? loftq->get("loftq_iter") : nullptr;
  if (!bits || !bits->isInteger() || bits->num != 4)
    return sdError(path, ": loftq_config.loftq_bits must be 4 (sdc's LoftQ quantizes to NF4 only)");
  if (!iter || !iter->isInteger() || iter->num < 1 || iter->num > 1000)
    return sdError(path, ": loftq_config.loftq_iter must be an integer from 1 to 1000");
  c.loftqIter = int64_t(iter->num);
  return Status::ok();
}

// PEFT's OSFConfig: effective_rank (a ratio or a rank; null: half), the
// rank_pattern overrides and target_modules all only decide the shapes,
// which loading checks tensor by tensor. Fields that would make the adapter
// mean more than its three factors per module are refused.
StatusOr<LoraConfig> parseOsfConfig(const Json &doc, const std::string &path) {
  if (const Json *init = doc.get("init_weights"); init && init->type == Json::Type::Bool && !init->b)
    return sdError(path, ": 'init_weights' is false: the adapter's initial low factors are random, not the base ",
                   "weights' split, so the base model plus this adapter is not what PEFT computes");
  LoraConfig c;
  c.peftType = "OSF";
  SD_RETURN_IF_ERROR(readModulesToSave(doc, path, c.modulesToSave));
  const Json *rank = doc.get("effective_rank");
  if (rank && rank->type == Json::Type::Number) {
    if (!(rank->num > 0)) return sdError(path, ": effective_rank must be positive");
    c.effectiveRank = rank->num;
  } else if (rank && rank->type != Json::Type::Null) {
    return sdError(path, ": effective_rank must be a number");
  }
  return c;
}

// PEFT's IA3Config: feedforward_modules (a list of name endings, a regex,
// or null) decides which modules scale their input; loading compares a list
// with the plan's module by module (each vector's shape tells its side too).
StatusOr<LoraConfig> parseIa3Config(const Json &doc, const std::string &path) {
  LoraConfig c;
  c.peftType = "IA3";
  SD_RETURN_IF_ERROR(readModulesToSave(doc, path, c.modulesToSave));
  const Json *ff = doc.get("feedforward_modules");
  if (ff && ff->type == Json::Type::String) {
    c.feedforwardIsRegex = true;
  } else if (ff && ff->type == Json::Type::Array) {
    for (const Json &m : ff->arr) {
      if (m.type != Json::Type::String) return sdError(path, ": 'feedforward_modules' must be a list of module names");
      c.feedforwardEndings.push_back(m.str);
    }
  } else if (ff && ff->type != Json::Type::Null) {
    return sdError(path, ": 'feedforward_modules' must be a list of module names or a regex");
  }
  return c;
}

// PEFT's LoHaConfig and LoKrConfig (LyCORIS methods, `peft_type`): r and
// alpha; rank_dropout and module_dropout only steer training. Per-module
// ranks and the CP form of convolutions are refused (the shapes would not be
// the plan's).
StatusOr<LoraConfig> parseLycorisConfig(const Json &doc, const std::string &path, const char *peftType) {
  for (const char *key : {"rank_pattern", "alpha_pattern"})
    if (const Json *v = doc.get(key); v && v->type == Json::Type::Object && !v->obj.empty())
      return sdError(path, ": '", key, "' is set: per-module ranks and alphas are not supported yet");
  const Json *r = doc.get("r"), *alpha = doc.get("alpha");
  if (!r || !r->isInteger() || r->num < 1) return sdError(path, ": r must be a positive integer");
  if (!alpha || alpha->type != Json::Type::Number) return sdError(path, ": alpha must be a number");
  LoraConfig c;
  c.peftType = peftType;
  c.r = int64_t(r->num);
  c.alpha = alpha->num;
  SD_RETURN_IF_ERROR(readModulesToSave(doc, path, c.modulesToSave));
  return c;
}

// PEFT's LoKrConfig: a LyCORIS config whose decompose_both and
// decompose_factor also decide the factors' shapes (loading compares them
// with the plan's).
StatusOr<LoraConfig> parseLokrConfig(const Json &doc, const std::string &path) {
  auto c = parseLycorisConfig(doc, path, "LOKR");
  if (!c.isOk()) return c;
  const Json *both = doc.get("decompose_both"), *factor = doc.get("decompose_factor");
  if (both && both->type != Json::Type::Bool && both->type != Json::Type::Null)
    return sdError(path, ": decompose_both must be true or false");
  if (factor && factor->type != Json::Type::Null &&
      (!factor->isInteger() || factor->num == 0 || factor->num < -1 || factor->num > 16777216.0))
    return sdError(path, ": decompose_factor must be a positive integer or -1");
  c.value().decomposeBoth = both && both->type == Json::Type::Bool && both->b;
  c.value().decomposeFactor = factor && factor->isInteger() ? int64_t(factor->num) : -1;
  return c;
}

// PEFT's VeraConfig: r and projection_prng_key decide the shared
// projections (which sdc draws as PEFT does); save_projection whether the
// file holds them too. vera_dropout and d_initial only steer training.
StatusOr<LoraConfig> parseVeraConfig(const Json &doc, const std::string &path) {
  const Json *r = doc.get("r"), *key = doc.get("projection_prng_key"), *save = doc.get("save_projection");
  if (!r || !r->isInteger() || r->num < 1) return sdError(path, ": r must be a positive integer");
  if (key && key->type != Json::Type::Null && (!key->isInteger() || key->num < 0 || key->num > 4294967295.0))
    return sdError(path, ": projection_prng_key must be an integer from 0 to 2^32 - 1");
  if (const Json *bias = doc.get("bias"); bias && bias->type == Json::Type::String && bias->str != "none")
    return sdError(path, ": 'bias' is '", bias->str, "': trained biases are not supported yet (only \"none\")");
  LoraConfig c;
  c.peftType = "VERA";
  c.r = int64_t(r->num);
  c.projectionKey = key && key->isInteger() ? int64_t(key->num) : 0;
  c.saveProjection = !save || save->type != Json::Type::Bool || save->b;
  SD_RETURN_IF_ERROR(readModulesToSave(doc, path, c.modulesToSave));
  return c;
}

// PEFT's PromptTuningConfig and PrefixTuningConfig (`prefix`) for a causal
// LM: num_virtual_tokens decides the shape with the model's (loading compares
// it with the plan's). An encoder-decoder's prompts (num_transformer_submodules
// 2) and other tasks are refused. A prefix trained through an MLP
// (prefix_projection) is saved as the MLP's output, which loads as any prefix.
StatusOr<LoraConfig> parsePromptTuningConfig(const Json &doc, const std::string &path, bool prefix) {
  const Json *n = doc.get("num_virtual_tokens"), *dim = doc.get("token_dim"),
             *parts = doc.get("num_transformer_submodules"), *task = doc.get("task_type"),
             *init = doc.get("prompt_tuning_init");
  if (!n || !n->isInteger() || n->num < 1 || n->num > 65536)
    return sdError(path, ": num_virtual_tokens must be an integer from 1 to 65536");
  if (parts && parts->type != Json::Type::Null && !(parts->isInteger() && parts->num == 1))
    return sdError(path, ": num_transformer_submodules must be 1 (an encoder-decoder's prompts are not supported)");
  if (task && task->type == Json::Type::String && task->str != "CAUSAL_LM")
    return sdError(path, ": task_type is '", task->str, "': prompt tuning is supported for CAUSAL_LM only");
  if (dim && dim->type != Json::Type::Null && (!dim->isInteger() || dim->num < 1 || dim->num > 16777216.0))
    return sdError(path, ": token_dim must be a positive integer");
  LoraConfig c;
  if (const Json *projection = doc.get("prefix_projection"); prefix && projection && projection->type == Json::Type::Bool)
    c.prefixProjection = projection->b;
  c.peftType = prefix ? "PREFIX_TUNING" : "PROMPT_TUNING";
  for (auto [key, out] : {std::pair{"num_layers", &c.numLayers}, std::pair{"num_attention_heads", &c.numAttentionHeads}})
    if (const Json *v = doc.get(key); v && v->isInteger() && v->num >= 1 && v->num <= 16777216.0) *out = int64_t(v->num);
  c.numVirtualTokens = int64_t(n->num);
  c.tokenDim = dim && dim->isInteger() ? int64_t(dim->num) : 0;
  if (init && init->type == Json::Type::String) c.promptInit = init->str;
  if (const Json *text = doc.get("prompt_tuning_init_text"); text && text->type == Json::Type::String)
    c.promptInitText = text->str;
  if (const Json *path = doc.get("tokenizer_name_or_path"); path && path->type == Json::Type::String)
    c.tokenizerPath = path->str;
  SD_RETURN_IF_ERROR(readModulesToSave(doc, path, c.modulesToSave));
  return c;
}

} // namespace

StatusOr<LoraConfig> readAdapterConfig(const std::string &dir) {
  std::string path = dir + "/" + kAdapterConfigFile;
  auto text = readWholeFile(path);
  if (!text.isOk()) return text.status();
  return parseAdapterConfig(text.value(), path);
}

// PEFT's AdaLoraConfig: init_r and lora_alpha decide the adapter's shapes
// and scale; the schedule only steers training (kept to write back). A
// rank_pattern (saved after pruning, with each module's tensors cut to its
// kept triplets) is refused for now.
// AdaLoRA's schedule fields, where an adapter config or a plan's names them (PEFT's names).
static void readAdaloraSchedule(const Json &doc, LoraConfig &c) {
  auto integer = [&](const char *key, int64_t &out) {
    if (const Json *v = doc.get(key); v && v->isInteger()) out = int64_t(v->num);
  };
  auto real = [&](const char *key, double &out) {
    if (const Json *v = doc.get(key); v && v->type == Json::Type::Number) out = v->num;
  };
  integer("target_r", c.targetR), integer("tinit", c.tinit), integer("tfinal", c.tfinal), integer("deltaT", c.deltaT);
  integer("total_step", c.totalStep);
  real("beta1", c.beta1), real("beta2", c.beta2), real("orth_reg_weight", c.orthRegWeight);
}

// rank_pattern: "<module>.lora_E" (PEFT's key, base_model.model. dropped) ->
// one true/false per triplet, true where the file holds it.
static Status readRankPattern(const Json &doc, const std::string &path, LoraConfig &c) {
  const Json *pattern = doc.get("rank_pattern");
  if (!pattern || pattern->type == Json::Type::Null) return Status::ok();
  if (pattern->type != Json::Type::Object) return sdError(path, ": 'rank_pattern' must be an object or null");
  const std::string suffix = ".lora_E", prefix = kAdapterKeyPrefix;
  for (auto &[key, kept] : pattern->obj) {
    std::string module = key.rfind(prefix, 0) == 0 ? key.substr(prefix.size()) : key;
    if (module.size() <= suffix.size() || module.compare(module.size() - suffix.size(), suffix.size(), suffix) != 0)
      return sdError(path, ": rank_pattern key '", key, "' is not a module's lora_E");
    module.resize(module.size() - suffix.size());
    if (kept.type != Json::Type::Array) return sdError(path, ": rank_pattern '", key, "' must be a list of true/false");
    std::vector<bool> flags;
    for (const Json &f : kept.arr) {
      if (f.type != Json::Type::Bool) return sdError(path, ": rank_pattern '", key, "' must be a list of true/false");
      flags.push_back(f.b);
    }
    c.rankPattern[module] = flags;
  }
  return Status::ok();
}

static StatusOr<LoraConfig> parseAdaloraConfig(const Json &doc, const std::string &path) {
  const Json *r = doc.get("init_r"), *alpha = doc.get("lora_alpha");
  if (!r || !r->isInteger() || r->num < 1) return sdError(path, ": init_r must be a positive integer");
  if (!alpha || alpha->type != Json::Type::Number) return sdError(path, ": lora_alpha must be a number");
  LoraConfig c;
  c.peftType = "ADALORA";
  c.r = int64_t(r->num);
  c.alpha = alpha->num;
  readAdaloraSchedule(doc, c);
  SD_RETURN_IF_ERROR(readRankPattern(doc, path, c));
  for (auto &[m, kept] : c.rankPattern)
    if (int64_t(kept.size()) != c.r)
      return sdError(path, ": rank_pattern of '", m, "' has ", kept.size(), " entries, init_r is ", c.r);
  SD_RETURN_IF_ERROR(readModulesToSave(doc, path, c.modulesToSave));
  return c;
}

StatusOr<LoraConfig> parseAdapterConfig(const std::string &text, const std::string &path) {
  auto doc = parseJson(text, path);
  if (!doc.isOk()) return doc.status();
  if (isAdapterHubConfig(doc.value())) return parseAdapterHubConfig(doc.value(), path);
  const Json *type = doc.value().get("peft_type"), *r = doc.value().get("r"), *alpha = doc.value().get("lora_alpha"),
             *rs = doc.value().get("use_rslora");
  if (type && type->str == "OSF") return parseOsfConfig(doc.value(), path);
  if (type && type->str == "IA3") return parseIa3Config(doc.value(), path);
  if (type && type->str == "LOHA") return parseLycorisConfig(doc.value(), path, "LOHA");
  if (type && type->str == "LOKR") return parseLokrConfig(doc.value(), path);
  if (type && type->str == "VERA") return parseVeraConfig(doc.value(), path);
  if (type && type->str == "ADALORA") return parseAdaloraConfig(doc.value(), path);
  if (type && type->str == "PROMPT_TUNING") return parsePromptTuningConfig(doc.value(), path, false);
  if (type && type->str == "PREFIX_TUNING") return parsePromptTuningConfig(doc.value(), path, true);
  if (!type || type->str != "LORA")
    return sdError(path, ": not a LoRA, OSF, IA3, LoHa, LoKr, VeRA, AdaLoRA, prompt or prefix tuning adapter (peft_type ",
                   "must be LORA, OSF, IA3, LOHA, LOKR, VERA, ADALORA, PROMPT_TUNING or PREFIX_TUNING), nor an ",
                   "AdapterHub bottleneck adapter");
  SD_RETURN_IF_ERROR(refuseUnsupportedSemantics(doc.value(), path));
  if (!r || !r->isInteger() || r->num < 1) return sdError(path, ": r must be a positive integer");
  if (!alpha || alpha->type != Json::Type::Number) return sdError(path, ": lora_alpha must be a number");
  LoraConfig c;
  c.r = int64_t(r->num);
  c.alpha = alpha->num;
  c.rslora = rs && rs->b;
  const Json *dora = doc.value().get("use_dora");
  c.useDora = dora && dora->type == Json::Type::Bool && dora->b;
  if (const Json *bias = doc.value().get("bias"); bias && bias->type == Json::Type::String) c.bias = bias->str;
  if (const Json *f = doc.value().get("fan_in_fan_out"); f && f->type == Json::Type::Bool) c.fanInFanOut = f->b;
  SD_RETURN_IF_ERROR(readBaseInit(doc.value(), path, c));
  SD_RETURN_IF_ERROR(readModulesToSave(doc.value(), path, c.modulesToSave));
  return c;
}

StatusOr<LoraConfig> loraConfigFromPlanConfig(const std::string &configJson) {
  auto doc = parseJson(configJson, "plan config");
  if (!doc.isOk()) return doc.status();
  LoraConfig c;
  if (doc.value().get("classify")) c.modulesToSave = {"classifier"};
  if (const Json *osf = doc.value().get("osf")) {
    const Json *mods = osf->get("modules"), *ranks = osf->get("ranks"), *rank = osf->get("effective_rank"),
               *crc = osf->get("base_weights_crc32c");
    if (!mods || mods->type != Json::Type::Array || !ranks || ranks->type != Json::Type::Array ||
        ranks->arr.size() != mods->arr.size() || !rank || rank->type != Json::Type::Number)
      return sdError("the plan's OSF configuration is malformed");
    c.peftType = "OSF";
    c.effectiveRank = rank->num;
    for (size_t i = 0; i < mods->arr.size(); ++i) {
      c.modules.push_back(mods->arr[i].str);
      c.ranks.push_back(int64_t(ranks->arr[i].num));
    }
    if (crc && crc->type == Json::Type::String) c.baseChecksum = crc->str;
    return c;
  }
  if (const Json *ia3 = doc.value().get("ia3")) {
    const Json *mods = ia3->get("modules"), *ff = ia3->get("feedforward"), *fanInFanOut = ia3->get("fan_in_fan_out");
    if (!mods || mods->type != Json::Type::Array || !ff || ff->type != Json::Type::Array)
      return sdError("the plan's IA3 configuration is malformed");
    c.peftType = "IA3";
    c.fanInFanOut = fanInFanOut && fanInFanOut->b;
    for (const Json &m : mods->arr) c.modules.push_back(m.str);
    for (const Json &m : ff->arr) c.feedforward.push_back(m.str);
    return c;
  }
  if (const Json *vera = doc.value().get("vera")) {
    const Json *r = vera->get("r"), *key = vera->get("projection_prng_key"), *mods = vera->get("modules"),
               *fanInFanOut = vera->get("fan_in_fan_out");
    if (!r || !r->isInteger() || !key || !key->isInteger() || !mods || mods->type != Json::Type::Array)
      return sdError("the plan's VeRA configuration is malformed");
    c.peftType = "VERA";
    c.r = int64_t(r->num);
    c.projectionKey = int64_t(key->num);
    c.fanInFanOut = fanInFanOut && fanInFanOut->b;
    const Json *dropout = vera->get("vera_dropout");
    c.dropout = dropout && dropout->type == Json::Type::Number ? dropout->num : 0.0;
    for (const Json &m : mods->arr) c.modules.push_back(m.str);
    return c;
  }
  if (const Json *loha = doc.value().get("loha")) {
    const Json *r = loha->get("r"), *alpha = loha->get("alpha"), *mods = loha->get("modules");
    if (!r || !r->isInteger() || !alpha || alpha->type != Json::Type::Number || !mods || mods->type != Json::Type::Array)
      return sdError("the plan's LoHa configuration is malformed");
    c.peftType = "LOHA";
    c.r = int64_t(r->num);
    c.alpha = alpha->num;
    for (const Json &m : mods->arr) c.modules.push_back(m.str);
    return c;
  }
  if (const Json *dylora = doc.value().get("dylora")) {
    const Json *r = dylora->get("r"), *alpha = dylora->get("alpha"), *block = dylora->get("block_size"),
               *mods = dylora->get("modules"), *fanInFanOut = dylora->get("fan_in_fan_out");
    if (!r || !r->isInteger() || r->num < 1 || !alpha || alpha->type != Json::Type::Number || !block ||
        !block->isInteger() || block->num < 1 || int64_t(r->num) % int64_t(block->num) != 0 || !mods ||
        mods->type != Json::Type::Array)
      return sdError("the plan's DyLoRA configuration is malformed");
    c.r = int64_t(r->num);
    c.dyloraBlockSize = int64_t(block->num);
    c.alpha = alpha->num * double(c.dyloraBlockSize); // at k blocks, alpha / k = (alpha x block size) / (k x block size)
    c.fanInFanOut = fanInFanOut && fanInFanOut->type == Json::Type::Bool && fanInFanOut->b;
    for (const Json &m : mods->arr) c.modules.push_back(m.str);
    return c;
  }
  if (const Json *lokr = doc.value().get("lokr")) {
    const Json *r = lokr->get("r"), *alpha = lokr->get("alpha"), *mods = lokr->get("modules"),
               *factors = lokr->get("factors"), *both = lokr->get("decompose_both"),
               *factor = lokr->get("decompose_factor");
    if (!r || !r->isInteger() || !alpha || alpha->type != Json::Type::Number || !mods ||
        mods->type != Json::Type::Array || !factors || factors->type != Json::Type::Array ||
        factors->arr.size() != mods->arr.size() || !factor || !factor->isInteger())
      return sdError("the plan's LoKr configuration is malformed");
    c.peftType = "LOKR";
    c.r = int64_t(r->num);
    c.alpha = alpha->num;
    c.decomposeBoth = both && both->type == Json::Type::Bool && both->b;
    c.decomposeFactor = int64_t(factor->num);
    for (size_t i = 0; i < mods->arr.size(); ++i) {
      c.modules.push_back(mods->arr[i].str);
      c.factors.push_back(factors->arr[i].str);
    }
    return c;
  }
  if (const Json *ada = doc.value().get("adalora")) {
    const Json *r = ada->get("init_r"), *alpha = ada->get("lora_alpha"), *mods = ada->get("modules");
    if (!r || !r->isInteger() || !alpha || alpha->type != Json::Type::Number || !mods || mods->type != Json::Type::Array)
      return sdError("the plan's AdaLoRA configuration is malformed");
    c.peftType = "ADALORA";
    c.r = int64_t(r->num);
    c.alpha = alpha->num;
    readAdaloraSchedule(*ada, c);
    const Json *fanInFanOut = ada->get("fan_in_fan_out");
    c.fanInFanOut = fanInFanOut && fanInFanOut->type == Json::Type::Bool && fanInFanOut->b;
    for (const Json &m : mods->arr) c.modules.push_back(m.str);
    return c;
  }
  for (bool prefix : {false, true}) {
    const Json *prompt = doc.value().get(prefix ? "prefix_tuning" : "prompt_tuning");
    if (!prompt) continue;
    const Json *n = prompt->get("num_virtual_tokens"), *dim = prompt->get("token_dim"),
               *init = prompt->get("prompt_tuning_init"), *first = prompt->get("first_virtual_id"),
               *layers = prompt->get("num_layers"), *heads = prompt->get("num_attention_heads");
    if (!n || !n->isInteger() || n->num < 1 || !dim || !dim->isInteger() || !first || !first->isInteger() ||
        first->num < 1 || (!prefix && (!init || init->type != Json::Type::String)) ||
        (prefix && (!layers || !layers->isInteger() || !heads || !heads->isInteger())))
      return sdError("the plan's ", prefix ? "prefix" : "prompt", " tuning configuration is malformed");
    c.peftType = prefix ? "PREFIX_TUNING" : "PROMPT_TUNING";
    c.firstVirtualId = int64_t(first->num);
    c.numVirtualTokens = int64_t(n->num);
    c.tokenDim = int64_t(dim->num);
    if (prefix) {
      c.numLayers = int64_t(layers->num);
      c.numAttentionHeads = int64_t(heads->num);
      const Json *projection = prompt->get("prefix_projection"), *hidden = prompt->get("encoder_hidden_size");
      c.prefixProjection = projection && projection->type == Json::Type::Bool && projection->b;
      if (c.prefixProjection && (!hidden || !hidden->isInteger() || hidden->num < 1))
        return sdError("the plan's prefix tuning configuration is malformed");
      c.encoderHiddenSize = c.prefixProjection ? int64_t(hidden->num) : 0;
    } else {
      c.promptInit = init->str;
      if (const Json *text = prompt->get("prompt_tuning_init_text"); text && text->type == Json::Type::String)
        c.promptInitText = text->str;
      if (const Json *path = prompt->get("tokenizer_name_or_path"); path && path->type == Json::Type::String)
        c.tokenizerPath = path->str;
    }
    return c;
  }
  if (const Json *bottleneck = doc.value().get("bottleneck")) {
    auto bn = bottleneckFromPlanConfig(*bottleneck);
    if (bn.isOk()) bn.value().modulesToSave = c.modulesToSave; // a classification plan's head
    return bn;
  }
  const Json *lora = doc.value().get("lora");
  if (!lora)
    return sdError("the plan has no adapters (compile it with --peft lora, osft, ia3, loha, lokr, vera, adalora, prompt, "
                   "prefix or bottleneck; the weights a full fine-tuning or BitFit plan trains go out with "
                   "--save-weights)");
  const Json *r = lora->get("r"), *alpha = lora->get("lora_alpha"), *rs = lora->get("use_rslora"),
             *mods = lora->get("modules"), *dropout = lora->get("lora_dropout"),
             *fanInFanOut = lora->get("fan_in_fan_out"), *dora = lora->get("use_dora");
  if (!r || !r->isInteger() || !alpha || alpha->type != Json::Type::Number || !mods ||
      mods->type != Json::Type::Array)
    return sdError("the plan's LoRA configuration is malformed");
  c.r = int64_t(r->num);
  c.alpha = alpha->num;
  c.rslora = rs && rs->b;
  c.dropout = dropout && dropout->type == Json::Type::Number ? dropout->num : 0.0;
  c.fanInFanOut = fanInFanOut && fanInFanOut->b;
  c.useDora = dora && dora->type == Json::Type::Bool && dora->b;
  for (const Json &m : mods->arr) c.modules.push_back(m.str);
  if (const Json *bias = lora->get("bias"); bias && bias->type == Json::Type::String) c.bias = bias->str;
  if (const Json *biases = lora->get("trained_biases"); biases && biases->type == Json::Type::Array)
    for (const Json &b : biases->arr) c.trainedBiases.push_back(b.str);
  if (const Json *init = lora->get("init_lora_weights");
      init && init->type == Json::Type::String && (init->str == "pissa" || init->str == "olora" || init->str == "loftq"))
    c.baseInit = init->str;
  if (const Json *iter = lora->get("loftq_iter"); iter && iter->isInteger()) c.loftqIter = int64_t(iter->num);
  if (const Json *slots = lora->get("max_loras")) {
    if (!slots->isInteger() || slots->num < 1) return sdError("the plan's LoRA configuration is malformed");
    c.maxLoras = int64_t(slots->num);
  }
  return c;
}

namespace {

// adapter_config.json as ordered fields, each value already JSON text.
using ConfigFields = std::vector<std::pair<std::string, std::string>>;

// Round-trip precision: loading compares lora_alpha with the plan's.
std::string number(double v) { return jsonNumber(v); }
std::string boolean(bool b) { return b ? "true" : "false"; }
std::string stringList(const std::vector<std::string> &names) {
  std::string list;
  for (const std::string &m : names) list += (list.empty() ? "" : ", ") + jsonQuote(m);
  return "[" + list + "]";
}

// The fields every PEFT release of the method knows; the rest take PEFT's
// defaults, so older and newer PEFT load the file without warnings.
// fan_in_fan_out: the base weights are [in, out] (GPT-2's Conv1D).
ConfigFields methodFields(const LoraConfig &cfg) {
  std::string targets = stringList(cfg.modules);
  if (cfg.isOsf()) {
    // The plan's ratio as effective_rank (PEFT floors ratio * min(out, in)
    // as sdc does) and every module's actual rank as an anchored
    // rank_pattern entry, so PEFT splits each weight exactly as the plan did.
    std::string pattern;
    for (size_t i = 0; i < cfg.modules.size() && i < cfg.ranks.size(); ++i) {
      std::string escaped;
      for (char ch : cfg.modules[i]) {
        if (std::strchr(".^$*+?()[]{}|\\", ch)) escaped += '\\';
        escaped += ch;
      }
      pattern += (pattern.empty() ? "" : ", ") + jsonQuote("(^|\\.)" + escaped + "$") + ": " + std::to_string(cfg.ranks[i]);
    }
    return {{"effective_rank", number(cfg.effectiveRank)}, {"target_modules", targets},
            {"rank_pattern", "{" + pattern + "}"}, {"init_weights", "true"}, {"target_svd_config", "null"}};
  }
  if (cfg.isIa3()) // full module names: each ends with itself, so PEFT's rule picks exactly the plan's
    return {{"target_modules", targets}, {"feedforward_modules", stringList(cfg.feedforward)},
            {"fan_in_fan_out", boolean(cfg.fanInFanOut)}, {"init_ia3_weights", "true"}};
  if (cfg.isLoha())
    return {{"r", std::to_string(cfg.r)}, {"alpha", number(cfg.alpha)}, {"rank_dropout", "0.0"},
            {"module_dropout", "0.0"}, {"target_modules", targets}, {"init_weights", "true"},
            {"use_effective_conv2d", "false"}, {"rank_pattern", "{}"}, {"alpha_pattern", "{}"}};
  if (cfg.isLokr())
    return {{"r", std::to_string(cfg.r)}, {"alpha", number(cfg.alpha)}, {"rank_dropout", "0.0"},
            {"module_dropout", "0.0"}, {"use_effective_conv2d", "false"},
            {"decompose_both", boolean(cfg.decomposeBoth)}, {"decompose_factor", std::to_string(cfg.decomposeFactor)},
            {"target_modules", targets}, {"init_weights", "true"}, {"rank_pattern", "{}"}, {"alpha_pattern", "{}"}};
  if (cfg.isPromptTuning()) // PEFT fills num_layers and num_attention_heads from the model it loads into
    return {{"num_virtual_tokens", std::to_string(cfg.numVirtualTokens)},
            {"token_dim", cfg.tokenDim ? std::to_string(cfg.tokenDim) : "null"},
            {"num_transformer_submodules", "1"}, {"num_attention_heads", "null"}, {"num_layers", "null"},
            {"prompt_tuning_init", jsonQuote(cfg.promptInit)},
            {"prompt_tuning_init_text", cfg.promptInitText.empty() ? "null" : jsonQuote(cfg.promptInitText)},
            {"tokenizer_name_or_path", cfg.tokenizerPath.empty() ? "null" : jsonQuote(cfg.tokenizerPath)},
            {"tokenizer_kwargs", "null"}};
  if (cfg.isPrefixTuning())
    return {{"num_virtual_tokens", std::to_string(cfg.numVirtualTokens)}, {"token_dim", std::to_string(cfg.tokenDim)},
            {"num_transformer_submodules", "1"}, {"num_attention_heads", std::to_string(cfg.numAttentionHeads)},
            {"num_layers", std::to_string(cfg.numLayers)},
            {"encoder_hidden_size", std::to_string(cfg.prefixProjection ? cfg.encoderHiddenSize : cfg.tokenDim)},
            {"prefix_projection", boolean(cfg.prefixProjection)}};
  // AdaLoRA: rank_pattern null, every triplet in the file (a pruned one's E
  // is 0); r is LoraConfig's default, which AdaLoRA ignores (PEFT warns on another).
  if (cfg.isAdalora())
    return {{"r", "8"}, {"init_r", std::to_string(cfg.r)}, {"target_r", std::to_string(cfg.targetR)},
            {"lora_alpha", number(cfg.alpha)}, {"lora_dropout", "0.0"}, {"tinit", std::to_string(cfg.tinit)},
            {"tfinal", std::to_string(cfg.tfinal)}, {"deltaT", std::to_string(cfg.deltaT)},
            {"beta1", number(cfg.beta1)}, {"beta2", number(cfg.beta2)},
            {"orth_reg_weight", number(cfg.orthRegWeight)}, {"total_step", std::to_string(cfg.totalStep)},
            {"target_modules", targets}, {"init_lora_weights", "true"}, {"rank_pattern", "null"},
            {"fan_in_fan_out", boolean(cfg.fanInFanOut)}, {"bias", "\"none\""}};
  if (cfg.isVera())
    return {{"r", std::to_string(cfg.r)}, {"target_modules", targets},
            {"projection_prng_key", std::to_string(cfg.projectionKey)}, {"save_projection", "true"},
            {"vera_dropout", number(cfg.dropout)}, {"d_initial", "0.1"}, {"fan_in_fan_out", boolean(cfg.fanInFanOut)},
            {"bias", "\"none\""}, {"init_weights", "true"}};
  return {{"r", std::to_string(cfg.r)}, {"lora_alpha", number(cfg.alpha)}, {"lora_dropout", number(cfg.dropout)},
          {"use_rslora", boolean(cfg.rslora)}, {"use_dora", boolean(cfg.useDora)}, {"target_modules", targets},
          {"bias", jsonQuote(cfg.bias)}, {"fan_in_fan_out", boolean(cfg.fanInFanOut)},
          {"init_lora_weights", cfg.baseInit.empty() ? "true" : jsonQuote(cfg.baseInit)},
          {"loftq_config", cfg.baseInit == "loftq"
                               ? "{\"loftq_bits\": 4, \"loftq_iter\": " + std::to_string(cfg.loftqIter) + "}"
                               : "{}"},
          {"rank_pattern", "{}"}, {"alpha_pattern", "{}"}, {"layers_to_transform", "null"},
          {"layers_pattern", "null"}};
}

} // namespace

std::string adapterConfigJson(const LoraConfig &cfg) {
  if (cfg.isBottleneck()) return adapterHubConfigJson(cfg);
  // A classification adapter is PEFT's SEQ_CLS task with its head in modules_to_save.
  bool classify = !cfg.modulesToSave.empty();
  ConfigFields fields = {{"peft_type", jsonQuote(cfg.peftType)},
                         {"task_type", classify ? "\"SEQ_CLS\"" : "\"CAUSAL_LM\""}};
  for (auto &f : methodFields(cfg)) fields.push_back(f);
  fields.insert(fields.end(), {{"inference_mode", "true"},
                               {"modules_to_save", classify ? stringList(cfg.modulesToSave) : "null"},
                               {"base_model_name_or_path", "null"},
                               {"revision", "null"}});
  std::string json = "{\n";
  for (size_t i = 0; i < fields.size(); ++i)
    json += "  " + jsonQuote(fields[i].first) + ": " + fields[i].second + (i + 1 < fields.size() ? ",\n" : "\n");
  return json + "}\n";
}

} // namespace sd
