// The frames of the JSON matcher that more than one file reads: their
// phases, and how a string frame takes a byte (the matcher follows strings
// with it; the vocabulary index asks it which tokens are plain string text).
#pragma once
#include "sd/generate/json_grammar.h"
#include <cstdint>

namespace sd::generate::frames {

// Phases of each kind of frame.
enum StringPhase : uint8_t { kStrOpen, kStrBody, kStrEscape, kStrHex, kStrUtf8 };
enum NumberPhase : uint8_t { kNumStart, kNumSign, kNumZero, kNumInt, kNumDot, kNumFrac, kNumExp, kNumExpSign, kNumExpDigits };
enum ObjectPhase : uint8_t { kObjOpen, kObjFirst, kObjKey, kObjKeyString, kObjColon, kObjValueStart, kObjValue, kObjAfter, kObjNext };
enum ArrayPhase : uint8_t { kArrOpen, kArrFirst, kArrValue, kArrAfter, kArrNext };

inline bool isDigit(unsigned char c) { return c >= '0' && c <= '9'; }
inline bool isHex(unsigned char c) { return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// A string frame after byte `c`; false when `c` cannot come there. `closed`:
// the byte was the closing quote.
bool stringNext(JsonMatcher::Frame &f, const JsonGrammar::Node &n, unsigned char c, bool &closed);

} // namespace sd::generate::frames
