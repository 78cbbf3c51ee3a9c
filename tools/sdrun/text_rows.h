// Generated text as it grows, shared by `sdrun generate` and `sdrun serve`:
// each row's new text is what decoding its tokens adds to decoding the prompt
// (as transformers' TextStreamer prints), held back while it ends in an
// incomplete character, and cut at stop texts.
#pragma once
#include "sd/format/status.h"
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace sdrun {

struct TextCodec {
  std::function<std::string(const std::vector<int64_t> &)> decode;
  std::function<std::string(int64_t)> piece; // one token's own text, special tokens shown
  std::set<int64_t> stopIds; // EOS ids and stop-token ids: the row ends, the token unshown
};

// Where a stop text ends generation: `generate` shows it (the text includes
// the stop), an OpenAI server does not (the text ends before it, and text
// that may be the start of a stop is held back until it is known not to be).
enum class StopText { Shown, Cut };

// One prompt being continued.
struct Row {
  std::vector<int64_t> tokens;
  size_t start = 0;          // first token decoded for the text (a few before the new ones suffice)
  std::string base, printed; // decoded tokens[start:] of the prompt; decoded text taken so far
  std::string shown;         // new text not yet taken by the caller
  bool done = false;
};

// The text each of `tokens` adds after `before` (the few tokens before it set
// its spacing), special tokens shown: how logprobs name a token, so that the
// tokens' texts add up to the text. Its own text where decoding does not
// extend (a partial character).
std::vector<std::string> tokenTexts(const TextCodec &codec, const std::vector<int64_t> &before,
                                    const std::vector<int64_t> &tokens);

// Starts `r` from its prompt tokens: decoding restarts `context` tokens
// before the first new one (a tokenizer's spacing depends on the token
// before), so the cost per token does not grow with the prompt.
void startRow(Row &r, const TextCodec &codec, size_t context = SIZE_MAX);

// Appends `token` and its text to r.shown; true when a stop text ended the row.
bool appendToken(Row &r, int64_t token, const TextCodec &codec, const std::vector<std::string> &stops,
                 StopText mode = StopText::Shown);

// At the row's end (its EOS, or the token limit): the text still held back
// (a partial character, the start of a stop text that never came) into r.shown.
void finishRow(Row &r, const TextCodec &codec);

// generation_config.json's eos_token_id (one id or a list: Llama 3 stops at
// <|eot_id|> and <|end_of_text|>); `name` names the file in errors.
sd::Status generationConfigEos(const std::string &text, const std::string &name, std::set<int64_t> &out);

} // namespace sdrun
