// libFuzzer target: bytes as a safetensors file (weights, adapters, checkpoint
// state). Every tensor that parses must lie inside the data section, and the
// finiteness check must read only its own bytes.
#include "sd/format/safetensors.h"
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::map<std::string, sd::NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  if (!sd::parseSafetensors(data, size, "fuzz", tensors, &metadata).isOk()) return 0;
  for (auto &[name, t] : tensors) {
    auto *p = static_cast<const uint8_t *>(t.data);
    if (p < data || p + t.bytes > data + size) std::abort();
    (void)sd::checkFiniteValues(t, "fuzz");
  }
  return 0;
}
