// GPT-2's pattern as a hand-written matcher (no regex engine: the same
// leftmost-alternative semantics, one pass), and the byte-level alphabet:
// printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100 upwards in byte order.
#include "byte_level.h"
#include "unicode.h"
#include <array>
#include <unordered_map>

namespace sd::tok {
namespace {

struct Alphabet {
  std::array<std::string, 256> encode;
  std::unordered_map<char32_t, uint8_t> decode;
  Alphabet() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? char32_t(b) : next++;
      appendUtf8(encode[size_t(b)], cp);
      decode[cp] = uint8_t(b);
    }
  }
};

const Alphabet &alphabet() {
  static const Alphabet a;
  return a;
}

enum class Kind { Letter, Number, Space, Other };

Kind kindOf(char32_t cp) {
  if (isWhitespace(cp)) return Kind::Space;
  if (isLetter(cp)) return Kind::Letter;
  if (isNumber(cp)) return Kind::Number;
  return Kind::Other;
}

} // namespace

std::vector<std::string_view> splitGpt2(std::string_view text) {
  // Decode once: code points with their byte offsets.
  std::vector<char32_t> cps;
  std::vector<size_t> at;
  for (size_t i = 0; i < text.size();) {
    at.push_back(i);
    cps.push_back(nextCodePoint(text, i));
  }
  at.push_back(text.size());
  const size_t n = cps.size();
  auto kind = [&](size_t k) { return kindOf(cps[k]); };
  // End of the run of `kd` starting at k.
  auto run = [&](size_t k, Kind kd) {
    while (k < n && kind(k) == kd) ++k;
    return k;
  };
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < n;) {
    size_t end = i;
    if (cps[i] == '\'' && i + 1 < n) { // 's 't 're 've 'm 'll 'd
      char32_t a = cps[i + 1], b = i + 2 < n ? cps[i + 2] : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) end = i + 3;
    }
    if (end == i) {
      // ` ?X+` for X a letter, a number or other (not space, letter, number).
      size_t k = cps[i] == ' ' && i + 1 < n && kind(i + 1) != Kind::Space ? i + 1 : i;
      Kind kd = kind(k);
      if (kd != Kind::Space) {
        end = run(k, kd);
      } else {
        // \s+(?!\S): the whitespace run, less its last character when a
        // non-space follows; else \s+ (that one character).
        size_t stop = run(i, Kind::Space);
        end = stop < n && stop - i > 1 ? stop - 1 : stop;
      }
    }
    pieces.emplace_back(text.data() + at[i], at[end] - at[i]);
    i = end;
  }
  return pieces;
}

std::string toByteLevel(std::string_view bytes) {
  const Alphabet &a = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += a.encode[uint8_t(c)];
  return out;
}

bool fromByteLevel(std::string_view token, std::string &out) {
  const Alphabet &a = alphabet();
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    auto it = a.decode.find(nextCodePoint(token, i));
    if (it == a.decode.end()) return false;
    bytes += char(it->second);
  }
  out += bytes;
  return true;
}

} // namespace sd::tok
