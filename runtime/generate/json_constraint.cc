// Structured output's token masks: the vocabulary indexed once (a byte trie,
// plain-text token bits), and a row's constraint asking its matcher as
// little as it can.
#include "json_frames.h"
#include <algorithm>
#include <tuple>

namespace sd::generate {

using namespace frames;
using Kind = JsonGrammar::Node::Kind;

std::shared_ptr<const JsonVocabulary> JsonVocabulary::make(std::shared_ptr<const TokenTable> table) {
  auto v = std::make_shared<JsonVocabulary>();
  const int64_t n = table->size();
  v->plainChars.assign(size_t(n), -1);
  v->plainUpTo.assign(kPlainLevels, TokenMask(n));
  v->plainOf.resize(kPlainLevels);
  v->otherByFirstByte.resize(256);
  v->trie.resize(1);
  JsonGrammar::Node body; // a string without limits
  body.kind = Kind::String;
  for (int64_t t = 0; t < n; ++t) {
    const TokenTable::Kind kind = table->kinds[size_t(t)];
    if (kind == TokenTable::Kind::End) v->ends.push_back(int32_t(t));
    const std::string &b = table->bytes[size_t(t)];
    if (kind != TokenTable::Kind::Text || b.empty()) continue;
    const unsigned char first = static_cast<unsigned char>(b[0]);
    int32_t at = 0;
    for (char c : b) {
      const unsigned char u = static_cast<unsigned char>(c);
      int32_t next = -1;
      for (const auto &[byte, child] : v->trie[size_t(at)].children)
        if (byte == u) next = child;
      if (next < 0) {
        next = int32_t(v->trie.size());
        v->trie[size_t(at)].children.emplace_back(u, next);
        v->trie.emplace_back();
      }
      at = next;
    }
    v->trie[size_t(at)].tokens.push_back(int32_t(t));
    // Plain text: bytes a string's body takes from a character's start.
    JsonMatcher::Frame f;
    f.phase = kStrBody;
    bool plain = true, closed = false;
    for (char c : b) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (u == '"' || u == '\\' || !stringNext(f, body, u, closed)) {
        plain = false;
        break;
      }
    }
    if (!plain) {
      v->otherByFirstByte[first].push_back(int32_t(t));
      continue;
    }
    v->plainChars[size_t(t)] = f.index;
    if (f.index >= kPlainLevels) v->longPlain.push_back(int32_t(t));
    else v->plainOf[size_t(f.index)].push_back(int32_t(t));
    for (int k = f.index; k < kPlainLevels; ++k) v->plainUpTo[size_t(k)].set(t);
  }
  v->table = std::move(table);
  return v;
}

void JsonConstraint::prepare() const {
  if (prepared_) return;
  nextBytes_ = matcher_.nextBytes();
  std::tie(room_, mostRoom_) = matcher_.plainStringRoom();
  prepared_ = true;
}

// A text token's verdict, its first byte known to be possible.
bool JsonConstraint::allowsText(int64_t token) const {
  const int32_t chars = vocab_->plainChars[size_t(token)];
  if (chars >= 0 && room_ >= 0) { // in a string's text: exactly when a reading has the room
    if (chars <= room_) return true;
    if (chars > mostRoom_) return false;
  }
  return matcher_.accepts(vocab_->table->bytes[size_t(token)]);
}

bool JsonConstraint::allows(int64_t token) const {
  const TokenTable &table = *vocab_->table;
  if (token < 0 || token >= table.size()) return false;
  switch (table.kinds[size_t(token)]) {
  case TokenTable::Kind::End: return matcher_.canEnd();
  case TokenTable::Kind::Other: return false;
  case TokenTable::Kind::Text: break;
  }
  const std::string &b = table.bytes[size_t(token)];
  if (b.empty()) return false;
  prepare();
  return nextBytes_.test(static_cast<unsigned char>(b[0])) && allowsText(token);
}

void JsonConstraint::allowedTokens(TokenMask &mask, int64_t tokens) const {
  mask.clear();
  prepare();
  const int64_t n = std::min(tokens, vocab_->table->size());
  auto decide = [&](const std::vector<int32_t> &list) {
    for (int32_t t : list)
      if (t < n && allowsText(t)) mask.set(t);
  };
  if (room_ >= 0) { // in a string's text: the plain tokens with room as words of bits, the others one by one
    const int64_t level = std::min<int64_t>(room_, JsonVocabulary::kPlainLevels - 1);
    const TokenMask &plain = vocab_->plainUpTo[size_t(level)];
    std::copy(plain.words.begin(), plain.words.begin() + long(std::min(plain.words.size(), mask.words.size())),
              mask.words.begin());
    for (int64_t k = level + 1; k < JsonVocabulary::kPlainLevels && k <= mostRoom_; ++k) decide(vocab_->plainOf[size_t(k)]);
    if (mostRoom_ >= JsonVocabulary::kPlainLevels) decide(vocab_->longPlain);
    for (int c = 0; c < 256; ++c)
      if (nextBytes_.test(size_t(c))) decide(vocab_->otherByFirstByte[size_t(c)]);
    for (int64_t t = n; t < int64_t(mask.words.size()) * 64; ++t) mask.reset(t); // past `tokens`
  } else {
    walk(0, matcher_, mask, n);
  }
  if (matcher_.canEnd())
    for (int32_t t : vocab_->ends)
      if (t < n) mask.set(t);
}

// The tokens below trie node `node`, `m` having followed the bytes to it:
// each branch is entered only when its byte may come.
void JsonConstraint::walk(int32_t node, const JsonMatcher &m, TokenMask &mask, int64_t tokens) const {
  for (const auto &[byte, child] : vocab_->trie[size_t(node)].children) {
    if (node == 0 ? !nextBytes_.test(byte) : !m.mayTake(byte)) continue;
    JsonMatcher next = m;
    if (!next.feed(std::string_view(reinterpret_cast<const char *>(&byte), 1))) continue;
    for (int32_t t : vocab_->trie[size_t(child)].tokens)
      if (t < tokens) mask.set(t);
    walk(child, next, mask, tokens);
  }
}

void JsonConstraint::accept(int64_t token) {
  const TokenTable &table = *vocab_->table;
  if (token >= 0 && token < table.size() && table.kinds[size_t(token)] == TokenTable::Kind::Text) {
    matcher_.feed(table.bytes[size_t(token)]);
    prepared_ = false;
  }
}

} // namespace sd::generate
