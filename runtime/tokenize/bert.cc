// BertNormalizer and BertPreTokenizer over generated tables.
#include "bert.h"
#include "unicode.h"
#include <algorithm>
#include <cstring>

namespace sd::tok {
namespace {

struct CodeRange {
  char32_t lo, hi;
};
struct CodeMapping {
  char32_t cp;
  const char *utf8;
};
#include "bert_tables.inc"

template <size_t N> bool inRanges(const CodeRange (&ranges)[N], char32_t cp) {
  const CodeRange *r = std::upper_bound(ranges, ranges + N, cp, [](char32_t c, const CodeRange &x) { return c < x.lo; });
  return r != ranges && cp <= (r - 1)->hi;
}

template <size_t N> const char *mapped(const CodeMapping (&map)[N], char32_t cp) {
  const CodeMapping *m = std::lower_bound(map, map + N, cp, [](const CodeMapping &x, char32_t c) { return x.cp < c; });
  return m != map + N && m->cp == cp ? m->utf8 : nullptr;
}

// Hangul syllables in canonical decomposition: leading, vowel and optional trailing jamo.
bool appendHangul(std::string &out, char32_t cp) {
  constexpr char32_t first = 0xAC00, count = 11172, vowels = 21, trailing = 28;
  if (cp < first || cp >= first + count) return false;
  const char32_t s = cp - first;
  appendUtf8(out, 0x1100 + s / (vowels * trailing));
  appendUtf8(out, 0x1161 + (s % (vowels * trailing)) / trailing);
  if (s % trailing) appendUtf8(out, 0x11A7 + s % trailing);
  return true;
}

void appendLower(std::string &out, char32_t cp, bool lowercase) {
  const char *lower = lowercase ? mapped(kBertLower, cp) : nullptr;
  if (lower) out += lower;
  else appendUtf8(out, cp);
}

} // namespace

std::string bertNormalize(std::string_view text, const BertNormalizerOptions &o) {
  std::string out, stripped;
  out.reserve(text.size() + 8);
  for (size_t i = 0; i < text.size();) {
    char32_t cp = nextCodePoint(text, i);
    if (o.cleanText) {
      if (inRanges(kBertRemoved, cp)) continue;
      if (inRanges(kBertSpaces, cp)) cp = ' ';
    }
    const bool cjk = o.chineseChars && inRanges(kBertCjk, cp);
    if (cjk) out += ' ';
    if (o.stripAccents) {
      stripped.clear();
      if (const char *s = mapped(kBertStrip, cp)) stripped = s;
      else if (!appendHangul(stripped, cp)) appendUtf8(stripped, cp);
      for (size_t k = 0; k < stripped.size();) appendLower(out, nextCodePoint(stripped, k), o.lowercase);
    } else {
      appendLower(out, cp, o.lowercase);
    }
    if (cjk) out += ' ';
  }
  return out;
}

std::vector<std::string_view> bertSplit(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t wordStart = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    const char32_t cp = nextCodePoint(text, i);
    const bool space = inRanges(kBertWhitespace, cp), punct = !space && inRanges(kBertPunctuation, cp);
    if (!space && !punct) continue;
    if (at > wordStart) pieces.push_back(text.substr(wordStart, at - wordStart));
    if (punct) pieces.push_back(text.substr(at, i - at));
    wordStart = i;
  }
  if (text.size() > wordStart) pieces.push_back(text.substr(wordStart));
  return pieces;
}

} // namespace sd::tok
