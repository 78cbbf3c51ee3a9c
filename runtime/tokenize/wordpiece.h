// The WordPiece model of a tokenizer.json (BERT): each word split greedily
// into the longest vocabulary pieces, continuations written "##piece"; a
// word with no such split, or too long, is the unk token.
#pragma once
#include "sd/format/json.h"
#include "vocab_model.h"

namespace sd::tok {

class WordPiece : public VocabModel {
public:
  Status load(const Json &model, const std::string &what);
  void encodeWord(std::string_view word, std::vector<int32_t> &out) const override;

private:
  std::string prefix_ = "##";
  int64_t maxChars_ = 100;
  int32_t unk_ = -1;
};

} // namespace sd::tok
