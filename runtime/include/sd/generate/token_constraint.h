// Constrained sampling: a rule on which tokens may come next (a grammar that
// the text must follow), consulted by the sampler of a row before it draws.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace sd::generate {

// A vocabulary as text: what each token adds to the text, so that rules on
// text can judge tokens.
struct TokenTable {
  enum class Kind : uint8_t {
    Text,  // adds `bytes` (possibly a part of a character)
    End,   // ends the text (an EOS or stop token): allowed where the text may end
    Other, // a special token with no text: never allowed
  };
  std::vector<std::string> bytes; // by token id
  std::vector<Kind> kinds;        // by token id
  int64_t size() const { return int64_t(kinds.size()); }
};

// A set of token ids, a bit each.
struct TokenMask {
  std::vector<uint64_t> words;
  explicit TokenMask(int64_t tokens = 0) : words(size_t((tokens + 63) / 64), 0) {}
  bool test(int64_t t) const { return words[size_t(t) >> 6] >> (t & 63) & 1; }
  void set(int64_t t) { words[size_t(t) >> 6] |= uint64_t(1) << (t & 63); }
  void reset(int64_t t) { words[size_t(t) >> 6] &= ~(uint64_t(1) << (t & 63)); }
  void clear() { std::fill(words.begin(), words.end(), 0); }
};

class TokenConstraint {
public:
  virtual ~TokenConstraint() = default;
  // Whether `token` may come next.
  virtual bool allows(int64_t token) const = 0;
  // allows() of every token of a vocabulary of `tokens` (a constraint may
  // know faster ways than asking one by one).
  virtual void allowedTokens(TokenMask &mask, int64_t tokens) const {
    mask.clear();
    for (int64_t t = 0; t < tokens; ++t)
      if (allows(t)) mask.set(t);
  }
  // The drawn token (one it allows): the rule moves past it.
  virtual void accept(int64_t token) = 0;
  // The text is complete and nothing may follow: the row ends here.
  virtual bool finished() const = 0;
};

} // namespace sd::generate
