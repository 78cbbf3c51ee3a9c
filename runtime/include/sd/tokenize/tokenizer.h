// Hugging Face tokenizers in C++: reads a tokenizer.json and encodes text to
// the ids the `tokenizers` library gives, and decodes them back. Supported so
// far: BPE models (merges as strings or pairs, byte_fallback, ignore_merges,
// unk), WordPiece with BERT's normalizer, pre-tokenizer and decoder, the
// ByteLevel pre-tokenizer with GPT-2's split pattern, the Split
// pre-tokenizer with Llama-3's and Qwen2's patterns, added and
// special tokens (lstrip, rstrip, single_word), the TemplateProcessing,
// BertProcessing, RobertaProcessing and ByteLevel post-processors, and the
// ByteLevel decoder. Anything else in the file is an error that names it.
#pragma once
#include "sd/format/status.h"
#include "sd/tokenize/chat_template.h"
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sd {

struct EncodeOptions {
  bool addSpecialTokens = true; // the post-processor's BOS/EOS/CLS/SEP
  // Special tokens written in the text are plain text unless this is set, so
  // user text cannot forge control tokens (the library's
  // split_special_tokens=True); non-special added tokens always match.
  bool parseSpecial = false;
};

// `s` with each invalid UTF-8 subpart as U+FFFD, as Python's
// bytes.decode(errors="replace") makes it (JSON text must be UTF-8).
std::string toValidUtf8(std::string_view s);

// The files a Hugging Face tokenizer is saved as, their text and the names
// errors give: tokenizer.json, and when there tokenizer_config.json (the
// special tokens, a chat template), chat_template.jinja (the chat template
// as transformers 5 saves it, taking priority over the config's, as
// transformers reads it) and generation_config.json (the model's EOS ids,
// saved beside them).
struct TokenizerFiles {
  std::string json, jsonName;
  std::string config, configName;                     // empty: none
  std::string chatTemplate, chatTemplateName;         // empty: none
  std::string generationConfig, generationConfigName; // empty: none
  // `path` is a tokenizer.json or a directory holding one; the others are
  // read from beside it.
  static StatusOr<TokenizerFiles> read(const std::string &path);
  // The files something carries under their usual names (a plan's: sdc
  // compile --tokenizer), `find` giving a file's bytes or null; errors name
  // them "`where`'s NAME". False when it carries no tokenizer.json.
  static bool carried(const std::function<const std::string *(const std::string &)> &find, const std::string &where,
                      TokenizerFiles &out);
  // The files there are, under their usual names, as a plan carries them: name, bytes.
  std::vector<std::pair<std::string, std::string>> named() const;
};

class Tokenizer {
public:
  // `path` is a tokenizer.json or a directory holding one.
  static StatusOr<std::unique_ptr<Tokenizer>> load(const std::string &path);
  static StatusOr<std::unique_ptr<Tokenizer>> fromFiles(const TokenizerFiles &files);
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions &options = {}) const;
  // An id outside the vocabulary is an error naming it.
  StatusOr<std::string> decode(const std::vector<int32_t> &ids, bool skipSpecialTokens = false) const;
  int32_t vocabSize() const;
  // The end-of-sequence token named by tokenizer_config.json beside the
  // tokenizer.json (eos_token), or -1 when there is none.
  int32_t eosId() const;
  // tokenizer_config.json's chat_template ("default" of several), or an
  // error saying why there is none or what in it cannot be rendered.
  StatusOr<const ChatTemplate *> chatTemplate() const;
  // The conversation rendered with the chat template (with tokenizer_config's
  // bos_token and eos_token as variables).
  // `tools`: the template's tools variable (OpenAI's functions), when given.
  StatusOr<std::string> renderChat(const std::vector<ChatMessage> &messages, bool addGenerationPrompt,
                                   const Json *tools = nullptr) const;
  // What each id adds to a text it follows, as bytes (a part of a UTF-8
  // character stays a part): how a grammar judges tokens. `special[id]` is
  // set for special tokens (their text is not generated text) and for ids
  // the vocabulary lacks.
  std::vector<std::string> tokenBytes(std::vector<bool> &special) const;
  // The id of a token (vocabulary or added), or -1.
  int32_t tokenId(const std::string &token) const;

private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace sd
