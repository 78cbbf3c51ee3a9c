// libFuzzer target: bytes as a PEFT adapter_config.json (also the JSON reader
// every config and header goes through).
#include "sd/format/peft.h"
#include <cmath>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  auto cfg = sd::parseAdapterConfig(text, "fuzz");
  if (cfg.isOk() && (cfg.value().r < 1 || !std::isfinite(cfg.value().alpha))) std::abort();
  return 0;
}
