// The split patterns of the pre-tokenizers of GPT-2 (ByteLevel with
// use_regex) and of Llama-3 and Qwen2 (a Split with their regex), matched
// without a regex engine. Each returns the pieces of valid UTF-8 `text`.
#pragma once
#include <string_view>
#include <vector>

namespace sd::tok {

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string_view> splitGpt2(std::string_view text);
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with D = maxDigits: 3 for Llama-3, 1 for Qwen2 (its \p{N}).
std::vector<std::string_view> splitLlama3(std::string_view text, int maxDigits);

} // namespace sd::tok
