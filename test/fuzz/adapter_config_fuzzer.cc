// libFuzzer target: bytes as a PEFT (or AdapterHub) adapter_config.json (also the JSON reader
// every config and header goes through).
#include "sd/format/peft.h"
#include <cmath>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  auto cfg = sd::parseAdapterConfig(text, "fuzz");
  if (!cfg.isOk()) return 0;
  // An accepted LoRA config has a rank and a finite alpha; an OSF one (no r or
  // lora_alpha of its own) a positive effective_rank or none (0); an IA3 one's
  // feedforward rule answers for any name, at once.
  const sd::LoraConfig &c = cfg.value();
  if (c.isIa3()) return c.feedforwardByRule("model.layers.0.mlp.down_proj") ? 0 : 0;
  if ((c.isLoha() || c.isLokr()) && (c.r < 1 || !std::isfinite(c.alpha))) std::abort();
  if (c.isLokr() && (c.decomposeFactor == 0 || c.decomposeFactor < -1)) std::abort();
  if (c.isVera() && (c.r < 1 || c.projectionKey < 0)) std::abort();
  if ((c.isPromptTuning() || c.isPrefixTuning()) &&
      (c.numVirtualTokens < 1 || c.numVirtualTokens > 65536 || c.tokenDim < 0 || c.numLayers < 0))
    std::abort();
  // An AdapterHub bottleneck adapter: one of the three configurations, a
  // finite positive reduction factor, a finite scaling, a name without dots.
  if (c.isBottleneck() &&
      ((c.bottleneckConfig != "seq_bn" && c.bottleneckConfig != "double_seq_bn" && c.bottleneckConfig != "par_bn") ||
       !(c.reductionFactor > 0) || !std::isfinite(c.reductionFactor) || !std::isfinite(c.scaling) ||
       c.adapterName.empty() || c.adapterName.find('.') != std::string::npos))
    std::abort();
  if (c.isLoha() || c.isLokr() || c.isVera() || c.isPromptTuning() || c.isPrefixTuning() || c.isBottleneck()) return 0;
  if (c.isOsf() ? !(c.effectiveRank >= 0 && std::isfinite(c.effectiveRank)) : (c.r < 1 || !std::isfinite(c.alpha)))
    std::abort();
  return 0;
}
