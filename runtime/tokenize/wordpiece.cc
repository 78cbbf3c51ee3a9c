// WordPiece: greedy longest-match-first over a word's characters.
#include "wordpiece.h"
#include "unicode.h"

namespace sd::tok {

Status WordPiece::load(const Json &model, const std::string &what) {
  SD_RETURN_IF_ERROR(loadVocab(model, what));
  if (const Json *p = model.get("continuing_subword_prefix"); p && p->type == Json::Type::String) prefix_ = p->str;
  if (const Json *m = model.get("max_input_chars_per_word"); m && m->isInteger()) maxChars_ = int64_t(m->num);
  const Json *unk = model.get("unk_token");
  if (!unk || unk->type != Json::Type::String || !tokenToId.count(unk->str))
    return sdError(what, ": the WordPiece model needs an unk_token from its vocab");
  unk_ = tokenToId[unk->str];
  return Status::ok();
}

void WordPiece::encodeWord(std::string_view word, std::vector<int32_t> &out) const {
  int64_t chars = 0;
  for (size_t i = 0; i < word.size(); ++chars) nextCodePoint(word, i);
  if (chars > maxChars_) {
    out.push_back(unk_);
    return;
  }
  const size_t mark = out.size();
  std::string piece;
  for (size_t start = 0; start < word.size();) {
    size_t end = word.size();
    int32_t found = -1;
    while (start < end) {
      piece.assign(start ? prefix_ : std::string());
      piece.append(word.substr(start, end - start));
      auto it = tokenToId.find(piece);
      if (it != tokenToId.end()) {
        found = it->second;
        break;
      }
      do --end; while (end > start && (uint8_t(word[end]) & 0xC0) == 0x80); // drop the last character
    }
    if (found < 0) { // no piece fits here: the whole word is unknown
      out.resize(mark);
      out.push_back(unk_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

} // namespace sd::tok
