// LoRA adapters in Hugging Face PEFT's layout: DIR/adapter_config.json and
// DIR/adapter_model.safetensors with keys
// base_model.model.<module>.lora_A.weight ([r, in]) and .lora_B.weight ([out, r]),
// so adapters move between sdrun and PEFT both ways.
#pragma once
#include "sd/runtime/session.h"
#include <string>
#include <vector>

namespace sd {

struct LoraConfig {
  int64_t r = 0;
  double alpha = 0;
  bool rslora = false;
  std::vector<std::string> modules; // adapted sd.linear modules
};

// The LoRA configuration a plan was compiled with (from its config JSON).
StatusOr<LoraConfig> loraConfigOf(const Plan &plan);
Status saveAdapter(const std::string &dir, const Session &session, const LoraConfig &cfg);
// Checks rank, alpha and modules against the plan, every shape, and that no
// tensor is missing or extra, before writing anything into the session.
Status loadAdapter(const std::string &dir, Session &session, const LoraConfig &cfg);

} // namespace sd
