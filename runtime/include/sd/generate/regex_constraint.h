// Generated text that matches a regular expression as a whole (vLLM's
// guided_regex): the text's UTF-8 characters stepped through the pattern's
// automaton; a token is allowed while the text stays the start of a match.
#pragma once
#include "sd/generate/json_grammar.h"
#include "sd/generate/pattern.h"
#include "sd/generate/token_constraint.h"
#include <memory>
#include <string>

namespace sd::generate {

// `pattern`: compiled with Pattern::Match::Whole.
class RegexConstraint : public TokenConstraint {
public:
  RegexConstraint(std::shared_ptr<const Pattern> pattern, std::shared_ptr<const JsonVocabulary> vocab);
  bool allows(int64_t token) const override;
  void allowedTokens(TokenMask &mask, int64_t tokens) const override;
  void accept(int64_t token) override;
  // The text matches and no character may follow.
  bool finished() const override;

private:
  struct State {
    PatternState re;
    uint32_t cp = 0;      // a character begun: its bits so far
    int32_t pending = 0;  // its continuation bytes to come
    uint8_t lo = 0, hi = 0; // the next continuation byte's range
  };
  bool step(State &s, unsigned char c) const;
  bool steps(State &s, const std::string &bytes) const;
  void walk(int32_t node, const State &s, TokenMask &mask, int64_t tokens) const;

  std::shared_ptr<const Pattern> pattern_;
  std::shared_ptr<const JsonVocabulary> vocab_;
  State state_;
};

} // namespace sd::generate
