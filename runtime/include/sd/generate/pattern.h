// JSON Schema's "pattern" (an ECMA-262 regular expression, unanchored unless
// it says ^ and $) as a Glushkov automaton over code points: a state is the
// set of pattern positions that may have read the last character, so a
// string's progress through its pattern fits in a fixed-size bit set and the
// JSON matcher can copy and compare it like the rest of its frames.
// Supported: literals, ., classes [...] (ranges, negation, \d \w \s inside),
// \d \D \w \W \s \S, escapes (\t \n \r \f \v \0 \xHH \uXXXX and escaped
// punctuation), groups ( ) and (?: ), alternation, * + ? {n} {n,} {n,m}
// (lazy forms too: generation only asks what may match), ^ at the start and
// $ at the end. Anything else (lookaround, backreferences, \b, \p{...}) is
// an error naming it.
#pragma once
#include "sd/format/status.h"
#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sd::generate {

class Pattern {
public:
  static constexpr int kMaxPositions = 127; // characters of the expanded pattern; one bit more: nothing read yet
  using State = std::bitset<kMaxPositions + 1>;

  // Search: JSON Schema's reading (a match anywhere unless ^ and $ say
  // otherwise); Whole: the whole text matches (vLLM's guided_regex), a ^ or
  // $ at the ends being those anchors.
  enum class Match { Search, Whole };
  static StatusOr<std::shared_ptr<const Pattern>> compile(const std::string &regex, Match match = Match::Search);

  State start() const;
  // The state after code point `cp`; none when it cannot come.
  State step(const State &s, uint32_t cp) const;
  // Whether some code point in [lo, hi] may come next.
  bool mayStep(const State &s, uint32_t lo, uint32_t hi) const;
  // Whether the text read so far matches.
  bool accepts(const State &s) const;

  using Ranges = std::vector<std::pair<uint32_t, uint32_t>>; // inclusive, sorted, disjoint

private:
  static constexpr int kStartBit = kMaxPositions;
  std::vector<Ranges> classes_; // by position
  std::vector<State> follow_;   // by position: the positions that may read next
  State first_, last_;
  bool nullable_ = false;
  friend struct PatternBuilder;
};

} // namespace sd::generate
