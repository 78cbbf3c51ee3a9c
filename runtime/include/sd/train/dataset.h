// Training data: JSON Lines with token ids (`input_ids`, optional `labels`),
// `text`, `prompt` and `completion` (loss on the completion only), or
// `messages` rendered with the tokenizer's chat template (loss on the
// assistant turns only); for classification plans, `text` or `input_ids`
// with an integer class `label`; for preference plans, `prompt`, `chosen`
// and `rejected` texts, or TRL's tokenized `prompt_ids`, `chosen_ids` and
// `rejected_ids`; for unpaired preference plans (KTO), `prompt` and
// `completion` (or `prompt_ids` and `completion_ids`) with a boolean
// `label`; for GRPO plans, `prompt` with `completions` (or `prompt_ids` with
// `completion_ids`, lists) and their `rewards`. Text is
// tokenized with a Hugging Face tokenizer when one is given, else taken as
// bytes (for 256-entry vocabularies). Every problem is reported as one line
// naming the file and line.
#pragma once
#include "sd/format/status.h"
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace sd {
class Tokenizer;

constexpr int64_t kIgnoreLabel = -100;

struct Example {
  std::vector<int64_t> ids;
  std::vector<int64_t> labels; // same length as ids; -100 = not trained on (empty for classification)
  int64_t label = kIgnoreLabel; // the class of a classification example; KTO: 1 desirable, 0 not
  int64_t promptLength = 0; // KTO: ids[0, promptLength) is the prompt, the rest the completion
  int64_t row = -1; // tensor data (tensor_data.h): the example's index along the arrays' first axis
  // A preference pair (sdc compile --recipe dpo, simpo, orpo): ids/labels hold the prompt
  // and the chosen completion, these the prompt and the rejected one (labels
  // -100 on the prompt in both).
  std::vector<int64_t> rejectedIds, rejectedLabels;
  // A group of scored completions (sdc compile --recipe grpo): each the
  // prompt and one completion (labels -100 on the prompt), one row each.
  std::vector<std::vector<int64_t>> groupIds, groupLabels;
  std::vector<float> rewards; // one per completion
  // --sampling-log-probs plans: per completion, per position of its groupIds,
  // the sampling policy's log-probability of that token (0 on the prompt).
  std::vector<std::vector<float>> groupLogProbs;
  // The longest sequence the example puts in a row.
  size_t length() const {
    size_t n = std::max(ids.size(), rejectedIds.size());
    for (const auto &g : groupIds) n = std::max(n, g.size());
    return n;
  }
};

struct DatasetOptions {
  int64_t vocab = 0;     // token ids must be below this
  int64_t maxLength = 0; // longest sequence the plan's buckets take
  bool truncate = false; // cut longer sequences instead of refusing them
  // Tokenizes text lines (the post-processor's BOS, then the tokenizer's EOS
  // after the text or completion); null: bytes.
  const Tokenizer *tokenizer = nullptr;
  // Classification plans (sdc --recipe classify): each line is one example
  // with "label" in [0, numLabels); text gets the post-processor's specials only.
  int64_t numLabels = 0;
  // Preference plans (sdc compile --recipe dpo, simpo, orpo): each line is a pair.
  bool pairs = false;
  // Unpaired preference plans (sdc compile --recipe kto): each line one labelled example.
  bool unpaired = false;
  // GRPO plans (sdc compile --recipe grpo): each line a prompt's group of this many scored completions.
  int64_t groupSize = 0;
  // GRPO plans compiled with --sampling-log-probs: each completion comes with
  // its tokens' log-probabilities under the policy that sampled it.
  bool samplingLogProbs = false;
  // GRPO sampling its own groups (sdrun train --reward-cmd): each line a
  // prompt, {"prompt": TEXT} or {"prompt_ids": [...]}, held in `ids`.
  bool promptsOnly = false;
};

// One data line (not blank); `where` ("FILE:LINE") prefixes errors.
StatusOr<Example> parseDataLine(const std::string &line, const std::string &where, const DatasetOptions &opts);
StatusOr<std::vector<Example>> loadJsonl(const std::string &path, const DatasetOptions &opts);

// A seeded permutation of [0, n), the same on every platform (Fisher-Yates
// over SplitMix64), so a resumed run sees the same order.
std::vector<size_t> shuffledOrder(size_t n, uint64_t seed);

} // namespace sd
