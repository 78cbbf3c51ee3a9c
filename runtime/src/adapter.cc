// PEFT-layout LoRA adapter files.
#include "sd/runtime/adapter.h"
#include "sd/runtime/json.h"
#include "sd/runtime/safetensors.h"
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace sd {
namespace {

constexpr const char *kPrefix = "base_model.model.";

std::string keyOf(const std::string &global) { return kPrefix + global; }

} // namespace

StatusOr<LoraConfig> loraConfigOf(const Plan &plan) {
  auto doc = parseJson(plan.config, "plan config");
  if (!doc.isOk()) return doc.status();
  const Json *lora = doc.value().get("lora");
  if (!lora) return sdError("the plan has no LoRA adapters (compile it with --peft lora)");
  LoraConfig c;
  const Json *r = lora->get("r"), *alpha = lora->get("lora_alpha"), *rs = lora->get("use_rslora"),
             *mods = lora->get("modules");
  if (!r || !r->isInteger() || !alpha || alpha->type != Json::Type::Number || !mods ||
      mods->type != Json::Type::Array)
    return sdError("the plan's LoRA configuration is malformed");
  c.r = int64_t(r->num);
  c.alpha = alpha->num;
  c.rslora = rs && rs->b;
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
      tensors.push_back({keyOf(m + part), v.dtype, v.dims, v.data, v.byteSize()});
    }
  SD_RETURN_IF_ERROR(writeSafetensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}}));
  std::string targets;
  for (const std::string &m : cfg.modules) targets += (targets.empty() ? "" : ", ") + jsonQuote(m);
  char alpha[32];
  std::snprintf(alpha, sizeof alpha, "%.17g", cfg.alpha);
  std::string json = "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": " + std::to_string(cfg.r) +
                     ",\n  \"lora_alpha\": " + alpha + ",\n  \"lora_dropout\": 0.0,\n  \"use_rslora\": " +
                     (cfg.rslora ? "true" : "false") + ",\n  \"target_modules\": [" + targets +
                     "],\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"init_lora_weights\": true,\n"
                     "  \"inference_mode\": true,\n  \"modules_to_save\": null,\n  \"base_model_name_or_path\": null\n}\n";
  std::string path = dir + "/adapter_config.json", tmp = path + ".tmp." + std::to_string(::getpid());
  FILE *f = std::fopen(tmp.c_str(), "wb");
  bool ok = f && std::fwrite(json.data(), 1, json.size(), f) == json.size() && std::fflush(f) == 0 &&
            ::fsync(::fileno(f)) == 0;
  if (f) ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return sdError(path, ": write failed");
  }
  return syncDirectory(dir);
}

Status loadAdapter(const std::string &dir, Session &session, const LoraConfig &cfg) {
  std::string cfgPath = dir + "/adapter_config.json";
  std::ifstream in(cfgPath, std::ios::binary);
  if (!in) return sdError(cfgPath, ": cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto doc = parseJson(text, cfgPath);
  if (!doc.isOk()) return doc.status();
  const Json *type = doc.value().get("peft_type"), *r = doc.value().get("r"), *alpha = doc.value().get("lora_alpha"),
             *rs = doc.value().get("use_rslora");
  if (!type || type->str != "LORA") return sdError(cfgPath, ": not a LoRA adapter (peft_type must be LORA)");
  if (!r || !r->isInteger() || int64_t(r->num) != cfg.r)
    return sdError(cfgPath, ": adapter rank r=", r ? r->num : 0, " differs from the plan's r=", cfg.r);
  if (!alpha || alpha->type != Json::Type::Number || std::fabs(alpha->num - cfg.alpha) > 1e-9 * std::fabs(cfg.alpha))
    return sdError(cfgPath, ": lora_alpha differs from the plan's ", cfg.alpha);
  if ((rs && rs->b) != cfg.rslora) return sdError(cfgPath, ": use_rslora differs from the plan's");
  std::string wPath = dir + "/adapter_model.safetensors";
  auto file = readSafetensors(wPath);
  if (!file.isOk()) return file.status();
  std::set<std::string> expected;
  std::vector<std::pair<int64_t, const NamedTensor *>> copies;
  for (const std::string &m : cfg.modules)
    for (const char *part : {".lora_A.weight", ".lora_B.weight"}) {
      std::string key = keyOf(m + part);
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
