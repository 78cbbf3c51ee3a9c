// libFuzzer target: bytes as one line of JSONL training data for a byte-level
// plan (vocabulary 256, buckets up to 64 tokens).
#include "sd/train/dataset.h"
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string line(reinterpret_cast<const char *>(data), size);
  for (bool truncate : {false, true}) {
    auto ex = sd::parseDataLine(line, "fuzz:1", sd::DatasetOptions{256, 64, truncate});
    if (!ex.isOk()) continue;
    const sd::Example &e = ex.value();
    if (e.ids.size() < 2 || e.ids.size() > 64 || e.labels.size() != e.ids.size()) std::abort();
    for (size_t i = 0; i < e.ids.size(); ++i)
      if (e.ids[i] < 0 || e.ids[i] >= 256 || (e.labels[i] != sd::kIgnoreLabel && (e.labels[i] < 0 || e.labels[i] >= 256)))
        std::abort();
  }
  return 0;
}
