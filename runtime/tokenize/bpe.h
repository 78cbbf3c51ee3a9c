// The BPE model of a tokenizer.json: a word's characters merged pair by pair,
// lowest merge rank first (leftmost on ties), as the tokenizers library does.
#pragma once
#include "sd/format/json.h"
#include "vocab_model.h"
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sd::tok {

class Bpe : public VocabModel {
public:
  // Reads model.vocab, model.merges (strings "a b" or pairs), unk_token,
  // byte_fallback, fuse_unk and ignore_merges; `what` names the file in errors.
  Status load(const Json &model, const std::string &what);
  // Appends the ids of one pre-tokenized word.
  void encodeWord(std::string_view word, std::vector<int32_t> &out) const override;

private:
  struct Merge {
    int32_t rank, id;
  };
  static uint64_t pairKey(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void symbolsOf(std::string_view word, std::vector<int32_t> &symbols) const;
  void mergeAll(std::vector<int32_t> &symbols) const;

  std::unordered_map<uint64_t, Merge> merges_;
  int32_t unk_ = -1;
  bool byteFallback_ = false, fuseUnk_ = false, ignoreMerges_ = false;
  mutable std::mutex cacheMutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

} // namespace sd::tok
