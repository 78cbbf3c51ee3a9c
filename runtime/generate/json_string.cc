// How a string frame of the JSON matcher takes a byte: escapes, UTF-8
// characters (their lead byte fixing which continuations may follow),
// length bounds, and a pattern stepped as each character completes.
#include "json_frames.h"
#include "sd/generate/pattern.h"
#include "sd/generate/utf8_reader.h"
#include <cstring>

namespace sd::generate::frames {
namespace {

// A patterned string takes code point `cp` (false: its pattern cannot).
bool patternStep(JsonMatcher::Frame &f, const Pattern &p, uint32_t cp) {
  f.re = p.step(f.re, cp);
  return f.re.any();
}

// Whether a patterned string may go on with a character whose code point
// starts with the bits of f.cp, `bits` bits still to come.
bool patternMay(const JsonMatcher::Frame &f, const Pattern &p, int bits) {
  return p.mayStep(f.re, f.cp << bits, (f.cp << bits) | ((1u << bits) - 1));
}

} // namespace

bool stringNext(JsonMatcher::Frame &f, const JsonGrammar::Node &n, unsigned char c, bool &closed) {
  closed = false;
  const Pattern *p = n.pattern.get();
  const bool room = n.maxCount < 0 || f.index < n.maxCount;
  switch (f.phase) {
  case kStrOpen:
    if (c != '"') return false;
    f.phase = kStrBody;
    if (p) f.re = p->start();
    return true;
  case kStrBody:
    if (c == '"') return closed = f.index >= n.minCount && (!p || p->accepts(f.re));
    if (!room || c < 0x20) return false;
    ++f.index;
    if (c == '\\') {
      f.phase = kStrEscape;
      return !p || p->mayStep(f.re, 0, 0xFFFF); // an escape writes a character of the first plane
    }
    if (c < 0x80) return !p || patternStep(f, *p, c);
    if (!utf8::lead(c, f.cp, f.pos, f.lo, f.hi)) return false;
    f.phase = kStrUtf8;
    return !p || patternMay(f, *p, 6 * f.pos);
  case kStrEscape: {
    if (c == 'u') {
      f.phase = kStrHex;
      f.pos = 4;
      f.cp = 0;
      return true;
    }
    static const char kEscapes[] = "\"\\/bfnrt";
    static const uint32_t kCodes[] = {'"', '\\', '/', 8, 12, 10, 13, 9};
    const char *at = c ? std::strchr(kEscapes, c) : nullptr;
    if (!at) return false;
    f.phase = kStrBody;
    return !p || patternStep(f, *p, kCodes[at - kEscapes]);
  }
  case kStrHex:
    if (!isHex(c)) return false;
    f.cp = f.cp * 16 + uint32_t(isDigit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
    if (--f.pos == 0) {
      f.phase = kStrBody;
      return !p || patternStep(f, *p, f.cp);
    }
    return !p || patternMay(f, *p, 4 * f.pos);
  case kStrUtf8:
    if (!utf8::next(c, f.cp, f.pos, f.lo, f.hi)) return false;
    if (f.pos == 0) {
      f.phase = kStrBody;
      return !p || patternStep(f, *p, f.cp);
    }
    return !p || patternMay(f, *p, 6 * f.pos);
  }
  return false;
}

} // namespace sd::generate::frames
