// A whole-text regular expression as a row constraint: UTF-8 decoded byte by
// byte (a lead byte allowed only when some character it may start can come),
// the vocabulary's trie walked along the bytes the pattern allows.
#include "sd/generate/regex_constraint.h"
#include "sd/generate/utf8_reader.h"

namespace sd::generate {

RegexConstraint::RegexConstraint(std::shared_ptr<const Pattern> pattern, std::shared_ptr<const JsonVocabulary> vocab)
    : pattern_(std::move(pattern)), vocab_(std::move(vocab)) {
  state_.re = pattern_->start();
}

bool RegexConstraint::step(State &s, unsigned char c) const {
  if (s.pending == 0) {
    if (c < 0x80) {
      s.re = pattern_->step(s.re, c);
      return s.re.any();
    }
    if (!utf8::lead(c, s.cp, s.pending, s.lo, s.hi)) return false;
  } else {
    if (!utf8::next(c, s.cp, s.pending, s.lo, s.hi)) return false;
    if (s.pending == 0) {
      s.re = pattern_->step(s.re, s.cp);
      return s.re.any();
    }
  }
  const int bits = 6 * s.pending; // some character this prefix may become must be able to come
  return pattern_->mayStep(s.re, s.cp << bits, (s.cp << bits) | ((1u << bits) - 1));
}

bool RegexConstraint::steps(State &s, const std::string &bytes) const {
  for (char c : bytes)
    if (!step(s, static_cast<unsigned char>(c))) return false;
  return true;
}

bool RegexConstraint::allows(int64_t token) const {
  const TokenTable &table = *vocab_->table;
  if (token < 0 || token >= table.size()) return false;
  switch (table.kinds[size_t(token)]) {
  case TokenTable::Kind::End: return state_.pending == 0 && pattern_->accepts(state_.re);
  case TokenTable::Kind::Other: return false;
  case TokenTable::Kind::Text: break;
  }
  State s = state_;
  const std::string &b = table.bytes[size_t(token)];
  return !b.empty() && steps(s, b);
}

void RegexConstraint::walk(int32_t node, const State &s, TokenMask &mask, int64_t tokens) const {
  for (const auto &[byte, child] : vocab_->trie[size_t(node)].children) {
    State next = s;
    if (!step(next, byte)) continue;
    for (int32_t t : vocab_->trie[size_t(child)].tokens)
      if (t < tokens) mask.set(t);
    walk(child, next, mask, tokens);
  }
}

void RegexConstraint::allowedTokens(TokenMask &mask, int64_t tokens) const {
  mask.clear();
  walk(0, state_, mask, tokens);
  if (state_.pending == 0 && pattern_->accepts(state_.re))
    for (int32_t t : vocab_->ends)
      if (t < tokens) mask.set(t);
}

void RegexConstraint::accept(int64_t token) {
  const TokenTable &table = *vocab_->table;
  if (token >= 0 && token < table.size() && table.kinds[size_t(token)] == TokenTable::Kind::Text)
    steps(state_, table.bytes[size_t(token)]);
}

bool RegexConstraint::finished() const {
  return state_.pending == 0 && pattern_->accepts(state_.re) && !pattern_->mayStep(state_.re, 0, 0x10FFFF);
}

} // namespace sd::generate
