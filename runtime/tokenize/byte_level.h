// GPT-2's byte-level alphabet (the ByteLevel pre-tokenizer and decoder of the
// tokenizers library).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace sd::tok {

// Each byte of `bytes` as its byte-level character (UTF-8).
std::string toByteLevel(std::string_view bytes);
// The inverse: appends the bytes of byte-level `token` to `out`; false (and
// nothing appended) when a character of it is not in the alphabet.
bool fromByteLevel(std::string_view token, std::string &out);

} // namespace sd::tok
