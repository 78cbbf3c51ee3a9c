// LoRA adapters in Hugging Face PEFT's layout: DIR/adapter_config.json and
// DIR/adapter_model.safetensors with keys
// base_model.model.<module>.lora_A.weight ([r, in]) and .lora_B.weight ([out, r]),
// so adapters move between sdc and PEFT both ways. The compiler (sdc merge,
// --peft lora) and the runtime (sdrun train/generate) share these.
#pragma once
#include "sd/format/status.h"
#include <cmath>
#include <string>
#include <vector>

namespace sd {

constexpr const char *kAdapterKeyPrefix = "base_model.model.";
// The two files of an adapter folder.
constexpr const char *kAdapterWeightsFile = "adapter_model.safetensors";
constexpr const char *kAdapterConfigFile = "adapter_config.json";
constexpr const char *kLoraASuffix = ".lora_A.weight";
constexpr const char *kLoraBSuffix = ".lora_B.weight";

// PEFT's scaling of B A: alpha / r, or alpha / sqrt(r) with rsLoRA.
inline double loraScale(double alpha, int64_t r, bool rslora) {
  return alpha / (rslora ? std::sqrt(double(r)) : double(r));
}

struct LoraConfig {
  int64_t r = 0;
  double alpha = 0;
  bool rslora = false;
  double dropout = 0; // PEFT's lora_dropout (training only; not compared on load)
  bool fanInFanOut = false; // the adapted weights are stored [in, out] (GPT-2's Conv1D)
  std::vector<std::string> modules; // adapted sd.linear modules

  double scale() const { return loraScale(alpha, r, rslora); }
};

// Key of a LoRA tensor in adapter_model.safetensors: "base_model.model." + name
// (name = "<module>.lora_A.weight" / "<module>.lora_B.weight").
std::string adapterKey(const std::string &name);

// The LoRA configuration recorded in a plan's config JSON ("lora" object).
StatusOr<LoraConfig> loraConfigFromPlanConfig(const std::string &configJson);
// r, lora_alpha and use_rslora of DIR/adapter_config.json (modules stay empty).
// Fields that would change the adapter's semantics beyond plain LoRA
// (use_dora, modules_to_save, rank_pattern, ...) are an error naming the field.
StatusOr<LoraConfig> readAdapterConfig(const std::string &dir);
StatusOr<LoraConfig> parseAdapterConfig(const std::string &text, const std::string &path);
// The adapter_config.json text PEFT loads for `cfg`.
std::string adapterConfigJson(const LoraConfig &cfg);

} // namespace sd
