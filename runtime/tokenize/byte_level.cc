// The byte-level alphabet: printable Latin-1 bytes stand for themselves, the
// other 68 bytes for U+0100 upwards in byte order.
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

} // namespace

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
