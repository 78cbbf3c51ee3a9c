// Guesses for speculative decoding from a second, smaller model (a draft
// model: transformers' assistant_model, vLLM's draft-model method). The
// draft decodes greedily a few tokens after each row's text; the target
// model then checks them all in one verify call, drawing each token as
// plain decoding would (Generator::nextBatch with drafts), so the tokens are
// the target's whatever the draft guesses. The draft needs the target's
// vocabulary, at least its rows and its context; its own cache follows each
// row's text (Generator reuses the prefix it holds, so tokens the target
// turned down are overwritten and accepted ones fed once).
#pragma once
#include "sd/generate/generator.h"
#include <memory>
#include <vector>

namespace sd::generate {

class DraftModel {
public:
  // An error names what `draft` lacks for `target`'s rows.
  static StatusOr<std::unique_ptr<DraftModel>> create(Generator &draft, const Generator &target);
  // Up to counts[b] greedy tokens after rows[b] (an empty row, or a count of
  // 0, gets none); the draft runs as many decode calls as the largest count.
  StatusOr<std::vector<std::vector<int64_t>>> guess(const std::vector<std::vector<int64_t>> &rows,
                                                    const std::vector<size_t> &counts);
  // A decode call's time in seconds, the catch-up of a guess's first call
  // included (a moving average; 0 before any).
  double secondsPerCall() const { return seconds_; }

private:
  explicit DraftModel(Generator &draft) : draft_(draft) {}
  Generator &draft_;
  std::vector<RowSampler> greedy_;
  double seconds_ = 0;
};

} // namespace sd::generate
