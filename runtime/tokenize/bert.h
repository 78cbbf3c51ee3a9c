// BERT's normalizer and pre-tokenizer (BertNormalizer, BertPreTokenizer of
// the tokenizers library), per code point from tables read off the library
// (scripts/gen_bert_tables.py).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace sd::tok {

struct BertNormalizerOptions {
  bool cleanText = true, chineseChars = true, stripAccents = true, lowercase = true;
};

// Valid UTF-8 in, normalized valid UTF-8 out. Combining marks are not put
// in canonical order after NFD (strip_accents removes the nonspacing ones).
std::string bertNormalize(std::string_view text, const BertNormalizerOptions &o);
// Splits on whitespace (dropped) and isolates each punctuation character.
std::vector<std::string_view> bertSplit(std::string_view text);

} // namespace sd::tok
