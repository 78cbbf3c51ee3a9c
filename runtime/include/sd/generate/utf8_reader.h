// A UTF-8 character read a byte at a time, as constraints on text follow
// tokens that may cut characters: the lead byte fixes how many continuation
// bytes follow and the range of the next (no overlong forms, no surrogates,
// nothing past U+10FFFF).
#pragma once
#include <cstdint>

namespace sd::generate::utf8 {

// A lead byte (0x80 and up): false when it starts no character; else `cp`
// holds its bits, `pending` the continuation bytes to come, [lo, hi] the next's range.
inline bool lead(unsigned char c, uint32_t &cp, int32_t &pending, uint8_t &lo, uint8_t &hi) {
  lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) pending = 1, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) pending = 2, cp = c & 0x0F, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) pending = 3, cp = c & 0x07, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return false;
  return true;
}

// A continuation byte: false when out of range; else added to `cp` (whole when `pending` reaches 0).
inline bool next(unsigned char c, uint32_t &cp, int32_t &pending, uint8_t &lo, uint8_t &hi) {
  if (c < lo || c > hi) return false;
  lo = 0x80, hi = 0xBF;
  cp = (cp << 6) | (c & 0x3F);
  --pending;
  return true;
}

} // namespace sd::generate::utf8
