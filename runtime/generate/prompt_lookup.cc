// Prompt lookup: the continuation of the latest earlier occurrence of the
// text's ending (sd/generate/prompt_lookup.h).
#include "sd/generate/prompt_lookup.h"
#include <algorithm>

namespace sd::generate {

std::vector<int64_t> PromptLookup::guess(const std::vector<int64_t> &tokens, size_t most) const {
  const size_t size = tokens.size();
  if (most == 0 || size < 2) return {};
  for (size_t n = std::min(maxNgram, size - 1); n >= std::max<size_t>(minNgram, 1); --n) {
    const auto ending = tokens.end() - long(n);
    // The latest start s < size - n whose n tokens equal the ending; the
    // latest, because text that loops or edits repeats what it did last.
    for (size_t s = size - n; s-- > 0;) {
      if (!std::equal(ending, tokens.end(), tokens.begin() + long(s))) continue;
      // What followed, copied on past the end as the text repeats with
      // period size - from: "x y x y" guesses "x y x y ..." rather than "x y".
      const size_t from = s + n;
      std::vector<int64_t> out;
      for (size_t i = 0; i < most; ++i)
        out.push_back(from + i < size ? tokens[from + i] : out[from + i - size]);
      return out;
    }
  }
  return {};
}

} // namespace sd::generate
