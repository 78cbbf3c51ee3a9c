// UTF-8 and the Unicode properties the tokenizers' patterns use. Text that is
// not valid UTF-8 is cleaned the way Python's bytes.decode(errors="replace")
// and Rust's from_utf8_lossy clean it (each maximal invalid subpart becomes
// one U+FFFD), so ids match what the `tokenizers` library gives that string.
#pragma once
#include <string>
#include <string_view>

namespace sd::tok {

// `s` with every invalid UTF-8 subpart replaced by U+FFFD.
std::string toValidUtf8(std::string_view s);
// The code point at s[i] of valid UTF-8, advancing i past it.
char32_t nextCodePoint(std::string_view s, size_t &i);
void appendUtf8(std::string &out, char32_t cp);

// `s` with every occurrence of `from` (not empty) replaced by `to`.
std::string replaceAll(const std::string &s, const std::string &from, const std::string &to);

bool isLetter(char32_t cp);     // \p{L}
bool isNumber(char32_t cp);     // \p{N}
bool isWhitespace(char32_t cp); // \s: the White_Space property

} // namespace sd::tok
