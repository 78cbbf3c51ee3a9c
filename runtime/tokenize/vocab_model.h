// What the tokenizer's models (BPE, WordPiece) share: a vocabulary both ways
// and the encoding of one pre-tokenized word.
#pragma once
#include "sd/format/json.h"
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sd::tok {

class VocabModel {
public:
  virtual ~VocabModel() = default;
  // Appends the ids of one pre-tokenized word.
  virtual void encodeWord(std::string_view word, std::vector<int32_t> &out) const = 0;

  std::vector<std::string> idToToken; // "" where an id has no token
  std::unordered_map<std::string, int32_t> tokenToId;

protected:
  // Reads model.vocab ({"token": id, ...}); `what` names the file in errors.
  Status loadVocab(const Json &model, const std::string &what);
};

} // namespace sd::tok
