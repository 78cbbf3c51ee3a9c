// PEFT's default target_modules for a transformers model_type (what its
// LoraConfig, IA3Config, ... use when target_modules is not given), so that
// `sdc compile model.onnx --peft lora` adapts what PEFT would.
#pragma once
#include <optional>
#include <string>

namespace sd {

struct PeftDefaultTargets {
  std::string targets;     // a --target-modules value: comma list of name endings, or a regex
  std::string feedforward; // IA3: a --feedforward-modules value (may be empty: none)
};

// `peft` is sdc's --peft value (lora, loha, lokr, dylora, vera, adalora,
// ia3, osft); none when PEFT has no default for that model_type and method
// (OSF has one for every model_type: all-linear where its table has none).
std::optional<PeftDefaultTargets> peftDefaultTargets(const std::string &peft, const std::string &modelType);

} // namespace sd
