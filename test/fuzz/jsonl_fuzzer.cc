// libFuzzer target: bytes as one line of JSONL training data for a byte-level
// plan (vocabulary 256, buckets up to 64 tokens), as a language model's data,
// as a 3-class classifier's, as a preference plan's pairs, as a KTO plan's
// unpaired examples and as a GRPO plan's groups of 3 scored completions.
#include "sd/train/dataset.h"
#include <cmath>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string line(reinterpret_cast<const char *>(data), size);
  for (bool truncate : {false, true}) {
    auto ex = sd::parseDataLine(line, "fuzz:1", sd::DatasetOptions{256, 64, truncate});
    if (ex.isOk()) {
      const sd::Example &e = ex.value();
      if (e.ids.size() < 2 || e.ids.size() > 64 || e.labels.size() != e.ids.size()) std::abort();
      for (size_t i = 0; i < e.ids.size(); ++i)
        if (e.ids[i] < 0 || e.ids[i] >= 256 ||
            (e.labels[i] != sd::kIgnoreLabel && (e.labels[i] < 0 || e.labels[i] >= 256)))
          std::abort();
    }
    sd::DatasetOptions pairs{256, 64, truncate};
    pairs.pairs = true;
    if (auto p = sd::parseDataLine(line, "fuzz:1", pairs); p.isOk()) {
      const sd::Example &e = p.value();
      for (auto [ids, labels] : {std::pair{&e.ids, &e.labels}, {&e.rejectedIds, &e.rejectedLabels}}) {
        if (ids->size() < 2 || ids->size() > 64 || labels->size() != ids->size()) std::abort();
        bool counted = false;
        for (size_t i = 0; i < ids->size(); ++i) {
          if ((*ids)[i] < 0 || (*ids)[i] >= 256) std::abort();
          if ((*labels)[i] != sd::kIgnoreLabel && (*labels)[i] != (*ids)[i]) std::abort();
          counted = counted || (i > 0 && (*labels)[i] != sd::kIgnoreLabel);
        }
        if (!counted) std::abort(); // a completion the loss would not see
      }
    }
    sd::DatasetOptions unpaired{256, 64, truncate};
    unpaired.pairs = unpaired.unpaired = true;
    if (auto u = sd::parseDataLine(line, "fuzz:1", unpaired); u.isOk()) {
      // The prompt is [0, promptLength), labelled -100; a completion token after the first follows.
      const sd::Example &e = u.value();
      if (e.ids.size() < 2 || e.ids.size() > 64 || e.labels.size() != e.ids.size() || (e.label != 0 && e.label != 1) ||
          e.promptLength < 0 || e.promptLength >= int64_t(e.ids.size()))
        std::abort();
      bool counted = false;
      for (size_t i = 0; i < e.ids.size(); ++i) {
        if (e.ids[i] < 0 || e.ids[i] >= 256) std::abort();
        if (int64_t(i) < e.promptLength ? e.labels[i] != sd::kIgnoreLabel : e.labels[i] != e.ids[i]) std::abort();
        counted = counted || (i > 0 && e.labels[i] != sd::kIgnoreLabel);
      }
      if (!counted) std::abort();
    }
    for (bool logps : {false, true}) {
      sd::DatasetOptions groups{256, 64, truncate};
      groups.groupSize = 3;
      groups.samplingLogProbs = logps;
      if (auto g = sd::parseDataLine(line, "fuzz:1", groups); g.isOk()) {
        // Exactly 3 completions, each within the bucket with a counted token after the first, and 3 finite rewards;
        // with sampling log-probabilities, one finite value <= 0 per position of each completion's row.
        const sd::Example &e = g.value();
        if (e.groupIds.size() != 3 || e.groupLabels.size() != 3 || e.rewards.size() != 3) std::abort();
        if (e.groupLogProbs.size() != (logps ? 3u : 0u)) std::abort();
        for (size_t k = 0; k < e.groupLogProbs.size(); ++k) {
          if (e.groupLogProbs[k].size() != e.groupIds[k].size()) std::abort();
          for (float v : e.groupLogProbs[k])
            if (!std::isfinite(v) || v > 0) std::abort();
        }
        for (size_t k = 0; k < 3; ++k) {
          const auto &ids = e.groupIds[k], &labels = e.groupLabels[k];
          if (ids.size() < 2 || ids.size() > 64 || labels.size() != ids.size() || !std::isfinite(e.rewards[k]))
            std::abort();
          bool counted = false;
          for (size_t i = 0; i < ids.size(); ++i) {
            if (ids[i] < 0 || ids[i] >= 256) std::abort();
            if (labels[i] != sd::kIgnoreLabel && labels[i] != ids[i]) std::abort();
            counted = counted || (i > 0 && labels[i] != sd::kIgnoreLabel);
          }
          if (!counted) std::abort();
        }
      }
    }
    sd::DatasetOptions classify{256, 64, truncate};
    classify.numLabels = 3;
    auto cls = sd::parseDataLine(line, "fuzz:1", classify);
    if (!cls.isOk()) continue;
    const sd::Example &c = cls.value();
    if (c.ids.empty() || c.ids.size() > 64 || !c.labels.empty() || c.label < 0 || c.label >= 3) std::abort();
    for (int64_t id : c.ids)
      if (id < 0 || id >= 256) std::abort();
  }
  return 0;
}
