// BPE: vocabulary and merge ranks from tokenizer.json, word merging with a
// per-word cache (natural text repeats its words).
#include "bpe.h"
#include "unicode.h"
#include <cstdio>
#include <limits>
#include <queue>

namespace sd::tok {

Status Bpe::load(const Json &model, const std::string &what) {
  SD_RETURN_IF_ERROR(loadVocab(model, what));
  auto flag = [&](const char *key) {
    const Json *v = model.get(key);
    return v && v->type == Json::Type::Bool && v->b;
  };
  byteFallback_ = flag("byte_fallback");
  fuseUnk_ = flag("fuse_unk");
  ignoreMerges_ = flag("ignore_merges");
  for (const char *key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const Json *v = model.get(key); v && v->type == Json::Type::String && !v->str.empty())
      return sdError(what, ": BPE ", key, " is not supported yet");
  if (const Json *d = model.get("dropout"); d && d->type == Json::Type::Number && d->num > 0)
    return sdError(what, ": BPE dropout is a training-time setting; export the tokenizer without it");
  if (const Json *u = model.get("unk_token"); u && u->type == Json::Type::String) {
    auto it = tokenToId.find(u->str);
    if (it == tokenToId.end()) return sdError(what, ": unk_token '", u->str, "' is not in the vocab");
    unk_ = it->second;
  }
  const Json *merges = model.get("merges");
  if (!merges || merges->type != Json::Type::Array) return sdError(what, ": the BPE model has no merges list");
  for (size_t r = 0; r < merges->arr.size(); ++r) {
    const Json &m = merges->arr[r];
    std::string a, b;
    if (m.type == Json::Type::String) {
      size_t space = m.str.find(' ');
      if (space == std::string::npos) return sdError(what, ": merge ", r, " ('", m.str, "') is not 'a b'");
      a = m.str.substr(0, space);
      b = m.str.substr(space + 1);
    } else if (m.type == Json::Type::Array && m.arr.size() == 2 && m.arr[0].type == Json::Type::String &&
               m.arr[1].type == Json::Type::String) {
      a = m.arr[0].str;
      b = m.arr[1].str;
    } else {
      return sdError(what, ": merge ", r, " is neither 'a b' nor a pair of strings");
    }
    auto ia = tokenToId.find(a), ib = tokenToId.find(b), im = tokenToId.find(a + b);
    if (ia == tokenToId.end() || ib == tokenToId.end() || im == tokenToId.end())
      return sdError(what, ": merge ", r, " ('", a, "', '", b, "') uses tokens missing from the vocab");
    merges_.emplace(pairKey(ia->second, ib->second), Merge{int32_t(r), im->second});
  }
  return Status::ok();
}

// One symbol per character; a character missing from the vocabulary becomes
// its <0xXX> byte tokens (byte_fallback) or the unk token (runs fused with
// fuse_unk), or is dropped when the model has neither, as the library does.
void Bpe::symbolsOf(std::string_view word, std::vector<int32_t> &symbols) const {
  for (size_t i = 0; i < word.size();) {
    size_t start = i;
    nextCodePoint(word, i);
    std::string ch(word.substr(start, i - start));
    auto it = tokenToId.find(ch);
    if (it != tokenToId.end()) {
      symbols.push_back(it->second);
      continue;
    }
    if (byteFallback_) {
      std::vector<int32_t> bytes;
      for (char c : ch) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", unsigned(uint8_t(c)));
        auto b = tokenToId.find(name);
        if (b == tokenToId.end()) break;
        bytes.push_back(b->second);
      }
      if (bytes.size() == ch.size()) {
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (unk_ >= 0 && !(fuseUnk_ && !symbols.empty() && symbols.back() == unk_)) symbols.push_back(unk_);
  }
}

// Merges the lowest-ranked adjacent pair (the leftmost of equals) until none
// is left: a heap of candidate pairs over a linked list of symbols, so a long
// word (a whole line, for tokenizers without a pre-tokenizer) costs n log n.
void Bpe::mergeAll(std::vector<int32_t> &symbols) const {
  const int64_t n = int64_t(symbols.size());
  if (n < 2) return;
  std::vector<int64_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) prev[size_t(k)] = k - 1, next[size_t(k)] = k + 1 < n ? k + 1 : -1;
  struct Candidate {
    int32_t rank;
    int64_t left;
    int32_t leftId, rightId;
    bool operator>(const Candidate &o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int64_t left) {
    if (left < 0 || next[size_t(left)] < 0) return;
    const int32_t a = symbols[size_t(left)], b = symbols[size_t(next[size_t(left)])];
    auto m = merges_.find(pairKey(a, b));
    if (m != merges_.end()) heap.push({m->second.rank, left, a, b});
  };
  for (int64_t k = 0; k + 1 < n; ++k) consider(k);
  std::vector<bool> dead(size_t(n), false);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    const int64_t right = next[size_t(c.left)];
    // Stale: a symbol of the pair was merged away or changed since.
    if (dead[size_t(c.left)] || right < 0 || symbols[size_t(c.left)] != c.leftId || symbols[size_t(right)] != c.rightId)
      continue;
    symbols[size_t(c.left)] = merges_.at(pairKey(c.leftId, c.rightId)).id;
    dead[size_t(right)] = true;
    next[size_t(c.left)] = next[size_t(right)];
    if (next[size_t(right)] >= 0) prev[size_t(next[size_t(right)])] = c.left;
    consider(prev[size_t(c.left)]);
    consider(c.left);
  }
  size_t kept = 0;
  for (int64_t k = 0; k < n; ++k)
    if (!dead[size_t(k)]) symbols[kept++] = symbols[size_t(k)];
  symbols.resize(kept);
}

void Bpe::encodeWord(std::string_view word, std::vector<int32_t> &out) const {
  if (ignoreMerges_) {
    auto whole = tokenToId.find(std::string(word));
    if (whole != tokenToId.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  std::string key(word);
  {
    std::lock_guard<std::mutex> lock(cacheMutex_);
    auto hit = cache_.find(key);
    if (hit != cache_.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbolsOf(word, symbols);
  mergeAll(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  std::lock_guard<std::mutex> lock(cacheMutex_);
  if (cache_.size() < 200000) cache_.emplace(std::move(key), std::move(symbols));
}

} // namespace sd::tok
