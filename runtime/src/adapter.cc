// PEFT-layout LoRA adapter files.
#include "sd/runtime/adapter.h"
#include "sd/runtime/json.h"
#include "sd/runtime/safetensors.h"
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <sys/stat.h>

namespace sd {

std::string adapterKey(const std::string &name) { return "base_model.model." + name; }

StatusOr<LoraConfig> readAdapterConfig(const std::string &dir) {
  std::string path = dir + "/adapter_config.json";
  auto text = readWholeFile(path);
  if (!text.isOk()) return text.status();
  auto doc = parseJson(text.value(), path);
  if (!doc.isOk()) return doc.status();
  const Json *type = doc.value().get("peft_type"), *r = doc.value().get("r"), *alpha = doc.value().get("lora_alpha"),
             *rs = doc.value().get("use_rslora");
  if (!type || type->str != "LORA") return sdError(path, ": not a LoRA adapter (peft_type must be LORA)");
  if (!r || !r->isInteger() || r->num < 1) return sdError(path, ": r must be a positive integer");
  if (!alpha || alpha->type != Json::Type::Number) return sdError(path, ": lora_alpha must be a number");
  LoraConfig c;
  c.r = int64_t(r->num);
  c.alpha = alpha->num;
  c.rslora = rs && rs->b;
  return c;
}

StatusOr<LoraConfig> loraConfigOf(const Plan &plan) {
  auto doc = parseJson(plan.config, "plan config");
  if (!doc.isOk()) return doc.status();
  const Json *lora = doc.value().get("lora");
  if (!lora) return sdError("the plan has no LoRA adapters (compile it with --peft lora)");
  LoraConfig c;
  const Json *r = lora->get("r"), *alpha = lora->get("lora_alpha"), *rs = lora->get("use_rslora"),
             *mods = lora->get("modules"), *dropout = lora->get("lora_dropout");
  if (!r || !r->isInteger() || !alpha || alpha->type != Json::Type::Number || !mods ||
      mods->type != Json::Type::Array)
    return sdError("the plan's LoRA configuration is malformed");
  c.r = int64_t(r->num);
  c.alpha = alpha->num;
  c.rslora = rs && rs->b;
  c.dropout = dropout && dropout->type == Json::Type::Number ? dropout->num : 0.0;
  for (const Json &m : mods->arr) c.modules.push_back(m.str);
  return c;
}

Status saveAdapter(const std::string &dir, const Session &session, const LoraConfig &cfg) {
  ::mkdir(dir.c_str(), 0755);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return sdError(dir, ": cannot create adapter folder");
  std::vector<NamedTensor> tensors;
  for (const std::string &m : cfg.modules)
    for (const char *part : {".lora_A.weight", ".lora_B.weight"}) {
      int64_t g = session.findGlobal(m + part);
      if (g < 0) return sdError("the plan has no global '", m, part, "'");
      TensorView v = session.global(size_t(g));
      tensors.push_back({adapterKey(m + part), v.dtype, v.dims, v.data, v.byteSize()});
    }
  SD_RETURN_IF_ERROR(writeSafetensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}}));
  std::string targets;
  for (const std::string &m : cfg.modules) targets += (targets.empty() ? "" : ", ") + jsonQuote(m);
  char alpha[32], dropout[32];
  std::snprintf(alpha, sizeof alpha, "%.17g", cfg.alpha);
  std::snprintf(dropout, sizeof dropout, "%.17g", cfg.dropout);
  std::string json = "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": " + std::to_string(cfg.r) +
                     ",\n  \"lora_alpha\": " + alpha + ",\n  \"lora_dropout\": " + dropout + ",\n  \"use_rslora\": " +
                     (cfg.rslora ? "true" : "false") + ",\n  \"target_modules\": [" + targets +
                     "],\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"init_lora_weights\": true,\n"
                     "  \"inference_mode\": true,\n  \"modules_to_save\": null,\n  \"base_model_name_or_path\": null\n}\n";
  SD_RETURN_IF_ERROR(writeFileAtomic(dir + "/adapter_config.json", json));
  return syncDirectory(dir);
}

Status loadAdapter(const std::string &dir, Session &session, const LoraConfig &cfg) {
  std::string cfgPath = dir + "/adapter_config.json";
  auto given = readAdapterConfig(dir);
  if (!given.isOk()) return given.status();
  if (given.value().r != cfg.r)
    return sdError(cfgPath, ": adapter rank r=", given.value().r, " differs from the plan's r=", cfg.r);
  if (std::fabs(given.value().alpha - cfg.alpha) > 1e-9 * std::fabs(cfg.alpha))
    return sdError(cfgPath, ": lora_alpha differs from the plan's ", cfg.alpha);
  if (given.value().rslora != cfg.rslora) return sdError(cfgPath, ": use_rslora differs from the plan's");
  std::string wPath = dir + "/adapter_model.safetensors";
  auto file = readSafetensors(wPath);
  if (!file.isOk()) return file.status();
  std::set<std::string> expected;
  std::vector<std::pair<int64_t, const NamedTensor *>> copies;
  for (const std::string &m : cfg.modules)
    for (const char *part : {".lora_A.weight", ".lora_B.weight"}) {
      std::string key = adapterKey(m + part);
      expected.insert(key);
      auto it = file.value().tensors.find(key);
      if (it == file.value().tensors.end())
        return sdError(wPath, ": no tensor for module '", m, "' (", key, "); the plan adapts it");
      int64_t g = session.findGlobal(m + part);
      if (g < 0) return sdError("the plan has no global '", m, part, "'");
      const GlobalDesc &gd = session.plan().globals[size_t(g)];
      if (it->second.dtype != gd.dtype || it->second.dims != gd.dims)
        return sdError(wPath, ": '", key, "' is ", dtypeName(it->second.dtype), "[", formatDims(it->second.dims),
                       "], the plan needs ", dtypeName(gd.dtype), "[", formatDims(gd.dims), "]");
      copies.push_back({g, &it->second});
    }
  for (auto &[key, t] : file.value().tensors)
    if (!expected.count(key))
      return sdError(wPath, ": tensor '", key, "' targets a module the plan does not adapt");
  for (auto &[g, t] : copies) std::memcpy(session.global(size_t(g)).data, t->data, t->bytes);
  return Status::ok();
}

} // namespace sd
