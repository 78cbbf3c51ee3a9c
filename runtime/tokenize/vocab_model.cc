// The vocabulary both models read from tokenizer.json.
#include "vocab_model.h"

namespace sd::tok {

Status VocabModel::loadVocab(const Json &model, const std::string &what) {
  const Json *vocab = model.get("vocab");
  if (!vocab || vocab->type != Json::Type::Object) return sdError(what, ": the model has no vocab object");
  for (const auto &[token, id] : vocab->obj) {
    if (!id.isInteger() || id.num < 0 || id.num > 1e8) return sdError(what, ": vocab entry '", token, "' has a bad id");
    int32_t i = int32_t(id.num);
    if (size_t(i) >= idToToken.size()) idToToken.resize(size_t(i) + 1);
    idToToken[size_t(i)] = token;
    tokenToId[token] = i;
  }
  return Status::ok();
}

} // namespace sd::tok
