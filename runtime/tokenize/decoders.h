// The decoder of a tokenizer.json, as the library runs it: each decoder maps
// the list of token strings to a new list (ByteLevel joins everything into
// one string, Fuse too), and the result is concatenated. No decoder: the
// tokens joined with spaces.
#pragma once
#include "sd/format/json.h"
#include <string>
#include <vector>

namespace sd::tok {

class DecoderChain {
public:
  // `decoder` is the file's decoder (null, one decoder or a Sequence).
  Status load(const Json *decoder, const std::string &what);
  std::string decode(std::vector<std::string> tokens) const { return run(std::move(tokens), false); }
  // The bytes the tokens decode to, partial UTF-8 characters kept as they
  // are (what a token adds to a text, for constrained generation).
  std::string decodeBytes(std::vector<std::string> tokens) const { return run(std::move(tokens), true); }

private:
  struct Step {
    enum class Kind { ByteLevel, WordPiece, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
    std::string a, b;            // WordPiece: prefix; Replace: from, to; Strip, Metaspace: the character
    int64_t start = 0, stop = 0; // Strip
    bool flag = false;           // WordPiece: cleanup; Metaspace: a space was prepended
  };
  Status add(const Json &d, const std::string &what);
  std::string run(std::vector<std::string> tokens, bool raw) const;
  std::vector<Step> steps_;
  bool join_ = true;
};

} // namespace sd::tok
