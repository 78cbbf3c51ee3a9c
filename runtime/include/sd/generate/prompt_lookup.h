// Guesses for speculative decoding without a second model: prompt lookup
// (transformers' prompt_lookup_num_tokens, vLLM's "ngram" method). Text that
// quotes, edits or repeats its context (code, summaries, extraction, JSON
// with repeated keys) often goes on as it went on after the same few tokens
// before, so the tokens that followed their last occurrence are the guess.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sd::generate {

struct PromptLookup {
  size_t maxNgram = 3; // the longest ending matched first
  size_t minNgram = 1; // the shortest tried before giving up

  // `most` tokens guessed to follow `tokens`: those after the latest earlier
  // occurrence of its final n tokens (n from maxNgram down to minNgram, the
  // first that recurs), copied on past the end as a repeat; none when no
  // ending recurs.
  std::vector<int64_t> guess(const std::vector<int64_t> &tokens, size_t most) const;
};

} // namespace sd::generate
