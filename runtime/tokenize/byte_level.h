// GPT-2's byte-level alphabet and split pattern (the ByteLevel pre-tokenizer
// and decoder of the tokenizers library).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace sd::tok {

// The pieces GPT-2's pattern cuts valid UTF-8 `text` into:
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string_view> splitGpt2(std::string_view text);
// Each byte of `bytes` as its byte-level character (UTF-8).
std::string toByteLevel(std::string_view bytes);
// The inverse: appends the bytes of byte-level `token` to `out`; false (and
// nothing appended) when a character of it is not in the alphabet.
bool fromByteLevel(std::string_view token, std::string &out);

} // namespace sd::tok
