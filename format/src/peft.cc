// PEFT's LoRA adapter layout: key naming, adapter_config.json reading and
// writing, and the LoRA section of a plan's config JSON.
#include "sd/format/peft.h"
#include "sd/format/json.h"
#include "sd/format/tensor_io.h"
#include <cstdio>

namespace sd {

std::string adapterKey(const std::string &name) { return kAdapterKeyPrefix + name; }

namespace {

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
      {"use_dora", "DoRA (weight-decomposed LoRA) is not supported yet"},
      {"lora_bias", "LoRA bias terms (lora_bias) are not supported yet"},
      {"use_qalora", "QALoRA is not supported yet"},
      {"modules_to_save", "fully trained extra modules (modules_to_save) are not supported yet"},
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
  if (const Json *bias = doc.get("bias"); bias && bias->type == Json::Type::String && bias->str != "none")
    return sdError(path, ": 'bias' is '", bias->str, "': trained biases are not supported yet (only \"none\")");
  // These initializations rewrite the base weights too, so the adapter only
  // fits a base model sdc does not have.
  if (const Json *init = doc.get("init_lora_weights"); init && init->type == Json::Type::String)
    for (const char *rewrites : {"pissa", "olora", "corda", "eva", "loftq"})
      if (init->str.rfind(rewrites, 0) == 0)
        return sdError(path, ": 'init_lora_weights' is '", init->str, "', which changes the base weights; convert the ",
                       "adapter to plain LoRA with PEFT (path_initial_model_for_weight_conversion) first");
  return Status::ok();
}

} // namespace

StatusOr<LoraConfig> readAdapterConfig(const std::string &dir) {
  std::string path = dir + "/" + kAdapterConfigFile;
  auto text = readWholeFile(path);
  if (!text.isOk()) return text.status();
  return parseAdapterConfig(text.value(), path);
}

StatusOr<LoraConfig> parseAdapterConfig(const std::string &text, const std::string &path) {
  auto doc = parseJson(text, path);
  if (!doc.isOk()) return doc.status();
  const Json *type = doc.value().get("peft_type"), *r = doc.value().get("r"), *alpha = doc.value().get("lora_alpha"),
             *rs = doc.value().get("use_rslora");
  if (!type || type->str != "LORA") return sdError(path, ": not a LoRA adapter (peft_type must be LORA)");
  SD_RETURN_IF_ERROR(refuseUnsupportedSemantics(doc.value(), path));
  if (!r || !r->isInteger() || r->num < 1) return sdError(path, ": r must be a positive integer");
  if (!alpha || alpha->type != Json::Type::Number) return sdError(path, ": lora_alpha must be a number");
  LoraConfig c;
  c.r = int64_t(r->num);
  c.alpha = alpha->num;
  c.rslora = rs && rs->b;
  return c;
}

StatusOr<LoraConfig> loraConfigFromPlanConfig(const std::string &configJson) {
  auto doc = parseJson(configJson, "plan config");
  if (!doc.isOk()) return doc.status();
  const Json *lora = doc.value().get("lora");
  if (!lora) return sdError("the plan has no LoRA adapters (compile it with --peft lora)");
  LoraConfig c;
  const Json *r = lora->get("r"), *alpha = lora->get("lora_alpha"), *rs = lora->get("use_rslora"),
             *mods = lora->get("modules"), *dropout = lora->get("lora_dropout"),
             *fanInFanOut = lora->get("fan_in_fan_out");
  if (!r || !r->isInteger() || !alpha || alpha->type != Json::Type::Number || !mods ||
      mods->type != Json::Type::Array)
    return sdError("the plan's LoRA configuration is malformed");
  c.r = int64_t(r->num);
  c.alpha = alpha->num;
  c.rslora = rs && rs->b;
  c.dropout = dropout && dropout->type == Json::Type::Number ? dropout->num : 0.0;
  c.fanInFanOut = fanInFanOut && fanInFanOut->b;
  for (const Json &m : mods->arr) c.modules.push_back(m.str);
  return c;
}

std::string adapterConfigJson(const LoraConfig &cfg) {
  std::string targets;
  for (const std::string &m : cfg.modules) targets += (targets.empty() ? "" : ", ") + jsonQuote(m);
  char alpha[32], dropout[32];
  std::snprintf(alpha, sizeof alpha, "%.17g", cfg.alpha);
  std::snprintf(dropout, sizeof dropout, "%.17g", cfg.dropout);
  // The fields every PEFT release since rsLoRA knows; the rest take PEFT's
  // defaults, so older and newer PEFT load this without warnings.
  // fan_in_fan_out: the base weights are [in, out] (GPT-2's Conv1D).
  std::string json = "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": " + std::to_string(cfg.r) +
                     ",\n  \"lora_alpha\": " + alpha + ",\n  \"lora_dropout\": " + dropout + ",\n  \"use_rslora\": " +
                     (cfg.rslora ? "true" : "false") + ",\n  \"use_dora\": false,\n  \"target_modules\": [" + targets +
                     "],\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": " + (cfg.fanInFanOut ? "true" : "false") +
                     ",\n  \"init_lora_weights\": true,\n  \"rank_pattern\": {},\n  \"alpha_pattern\": {},\n"
                     "  \"layers_to_transform\": null,\n  \"layers_pattern\": null,\n  \"inference_mode\": true,\n"
                     "  \"modules_to_save\": null,\n  \"base_model_name_or_path\": null,\n  \"revision\": null\n}\n";
  return json;
}

} // namespace sd
