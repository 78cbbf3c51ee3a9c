// UTF-8 cleaning and decoding, and category lookups over generated ranges.
#include "unicode.h"
#include <algorithm>
#include <cstdint>

namespace sd::tok {
namespace {

struct CodeRange {
  char32_t lo, hi;
};
#include "unicode_tables.inc"

template <size_t N> bool inRanges(const CodeRange (&ranges)[N], char32_t cp) {
  const CodeRange *end = ranges + N;
  const CodeRange *r = std::upper_bound(ranges, end, cp, [](char32_t c, const CodeRange &x) { return c < x.lo; });
  return r != ranges && cp <= (r - 1)->hi;
}

// Length of the valid sequence at s[i], or 0 with `bad` = the bytes of the
// maximal invalid subpart to replace (at least 1).
size_t validSequence(std::string_view s, size_t i, size_t &bad) {
  const uint8_t b = uint8_t(s[i]);
  if (b < 0x80) return 1;
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) len = 2;
  else if (b == 0xE0) len = 3, lo = 0xA0;
  else if (b >= 0xE1 && b <= 0xEC) len = 3;
  else if (b == 0xED) len = 3, hi = 0x9F;
  else if (b >= 0xEE && b <= 0xEF) len = 3;
  else if (b == 0xF0) len = 4, lo = 0x90;
  else if (b >= 0xF1 && b <= 0xF3) len = 4;
  else if (b == 0xF4) len = 4, hi = 0x8F;
  bad = 1;
  if (!len) return 0;
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) return 0;
    const uint8_t c = uint8_t(s[i + k]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
    bad = k + 1;
  }
  return len;
}

} // namespace

std::string toValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t bad = 1, n = validSequence(s, i, bad);
    if (n) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

char32_t nextCodePoint(std::string_view s, size_t &i) {
  const uint8_t b = uint8_t(s[i]);
  if (b < 0x80) return char32_t(s[i++]);
  size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t cp = b & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

void appendUtf8(std::string &out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string replaceAll(const std::string &s, const std::string &from, const std::string &to) {
  if (from.empty()) return s;
  std::string out;
  for (size_t i = 0;;) {
    size_t at = s.find(from, i);
    if (at == std::string::npos) return out.append(s, i, std::string::npos);
    out.append(s, i, at - i).append(to);
    i = at + from.size();
  }
}

bool isLetter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return inRanges(kLetterRanges, cp);
}

bool isNumber(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return inRanges(kNumberRanges, cp);
}

bool isWhitespace(char32_t cp) {
  switch (cp) {
  case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0: case 0x1680:
  case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
    return true;
  default:
    return cp >= 0x2000 && cp <= 0x200A;
  }
}

} // namespace sd::tok
