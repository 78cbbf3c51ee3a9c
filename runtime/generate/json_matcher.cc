// The JSON matcher: a pushdown automaton over bytes whose stack frames are
// grammar nodes in progress, run on every reading of the text at once.
#include "json_frames.h"
#include "sd/generate/pattern.h"
#include <algorithm>
#include <cstring>
#include <tuple>

namespace sd::generate {
namespace {

using namespace frames;

using Kind = JsonGrammar::Node::Kind;

constexpr size_t kMaxDepth = 128;  // nesting deeper than this is not generated
constexpr size_t kMaxReadings = 256; // stacks followed at once (a union's alternatives)
constexpr int kMaxExpansion = 64;   // unions within unions ($ref cycles end here)
// Frames a byte may start: a schema whose unions refer to themselves
// ({"anyOf": [{"$ref": "#"}, {"$ref": "#"}]}) would otherwise fan out
// exponentially; past this a byte's further readings are not followed.
constexpr int kMaxStartsPerByte = 4096;

bool numberAccepting(uint8_t phase) {
  return phase == kNumZero || phase == kNumInt || phase == kNumFrac || phase == kNumExpDigits;
}

// The next phase of a number after `c`, or -1.
int numberNext(uint8_t phase, unsigned char c, bool integer) {
  const bool dot = c == '.' && !integer, exp = (c == 'e' || c == 'E') && !integer;
  switch (phase) {
  case kNumStart: return c == '-' ? kNumSign : c == '0' ? kNumZero : isDigit(c) ? kNumInt : -1;
  case kNumSign: return c == '0' ? kNumZero : isDigit(c) ? kNumInt : -1;
  case kNumZero: return dot ? kNumDot : exp ? kNumExp : -1;
  case kNumInt: return isDigit(c) ? kNumInt : dot ? kNumDot : exp ? kNumExp : -1;
  case kNumDot: return isDigit(c) ? kNumFrac : -1;
  case kNumFrac: return isDigit(c) ? kNumFrac : exp ? kNumExp : -1;
  case kNumExp: return c == '+' || c == '-' ? kNumExpSign : isDigit(c) ? kNumExpDigits : -1;
  case kNumExpSign:
  case kNumExpDigits: return isDigit(c) ? kNumExpDigits : -1;
  }
  return -1;
}

// A number frame after byte `c` when the number goes on with it (its
// pattern, an integer range's, taking the character too); false otherwise.
bool numberGoesOn(JsonMatcher::Frame &f, const JsonGrammar::Node &n, unsigned char c) {
  const int next = numberNext(f.phase, c, n.kind == Kind::Integer);
  if (next < 0) return false;
  if (n.pattern) {
    if (f.phase == kNumStart) f.re = n.pattern->start();
    const PatternState re = n.pattern->step(f.re, c);
    if (re.none()) return false;
    f.re = re;
  }
  f.phase = uint8_t(next);
  return true;
}

// Whether the number may end here.
bool numberEnds(const JsonMatcher::Frame &f, const JsonGrammar::Node &n) {
  return numberAccepting(f.phase) && (!n.pattern || n.pattern->accepts(f.re));
}

// An object's properties that may be written next: from its next one up to
// the first required one (a required property is never skipped).
std::pair<size_t, size_t> nextProperties(const JsonGrammar::Node &n, int32_t from) {
  size_t end = size_t(from);
  while (end < n.properties.size() && !n.properties[end].required) ++end;
  return {size_t(from), std::min(end + 1, n.properties.size())};
}

bool requiredLeft(const JsonGrammar::Node &n, int32_t from) {
  for (size_t j = size_t(from); j < n.properties.size(); ++j)
    if (n.properties[j].required) return true;
  return false;
}

} // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> grammar) : g_(std::move(grammar)) {
  // One stack holding the document's frame (node -1): its first byte starts
  // the root value, and it pops when the root value ends.
  Frame document;
  document.node = -1;
  stacks_.push_back({document});
}

// The frame below a finished child moves on.
void JsonMatcher::childDone(Stack &s) const {
  if (s.empty()) return;
  Frame &f = s.back();
  if (f.node < 0) { // the document's root is done
    s.pop_back();
    return;
  }
  const Kind k = g_->node(f.node).kind;
  if (k == Kind::Object) f.phase = f.phase == kObjKeyString ? kObjColon : kObjAfter;
  else if (k == Kind::Array) {
    f.phase = kArrAfter;
    ++f.index;
  }
}

void JsonMatcher::startValue(Stack s, int32_t node, unsigned char c, std::vector<Stack> &out, int depth) const {
  if (depth > kMaxExpansion || s.size() >= kMaxDepth || ++starts_ > kMaxStartsPerByte) return;
  const JsonGrammar::Node &n = g_->node(node);
  if (n.kind == Kind::Union) {
    for (int32_t alt : n.alternatives) startValue(s, alt, c, out, depth + 1);
    return;
  }
  if (n.kind == Kind::Literal) {
    for (size_t i = 0; i < n.literals.size(); ++i)
      if (!n.literals[i].empty() && static_cast<unsigned char>(n.literals[i][0]) == c) {
        Stack t = s;
        Frame f;
        f.node = node;
        f.index = int32_t(i);
        t.push_back(f);
        feedStack(std::move(t), c, out, depth + 1);
      }
    return;
  }
  Frame f;
  f.node = node;
  s.push_back(f);
  feedStack(std::move(s), c, out, depth + 1);
}

void JsonMatcher::tryObject(Stack &s, unsigned char c, std::vector<Stack> &out, int depth) const {
  Frame &f = s.back();
  const JsonGrammar::Node &n = g_->node(f.node);
  const bool listed = n.additional < 0; // keys from `properties`; else any keys
  auto keyStart = [&]() {
    if (c != '"') return;
    if (!listed) {
      f.phase = kObjKeyString;
      f.pos = -1;
      Frame key;
      key.node = 0; // the grammar's plain string
      key.phase = kStrBody;
      s.push_back(key);
      out.push_back(s);
      return;
    }
    const auto [from, to] = nextProperties(n, f.index);
    for (size_t j = from; j < to; ++j) {
      Stack t = s;
      t.back().phase = kObjKey;
      t.back().pos = int32_t(j);
      t.back().sub = 1; // the opening quote
      out.push_back(std::move(t));
    }
  };
  auto close = [&]() {
    if (c != '}' || (listed && requiredLeft(n, f.index))) return;
    s.pop_back();
    childDone(s);
    out.push_back(s);
  };
  switch (f.phase) {
  case kObjOpen:
    if (c == '{') {
      f.phase = kObjFirst;
      out.push_back(s);
    }
    return;
  case kObjFirst:
    if (c == '}') close();
    else keyStart();
    return;
  case kObjNext: keyStart(); return;
  case kObjKey: {
    const std::string &key = n.properties[size_t(f.pos)].key;
    if (static_cast<unsigned char>(key[size_t(f.sub)]) != c) return;
    if (size_t(++f.sub) == key.size()) {
      f.phase = kObjColon;
      f.index = f.pos + 1;
    }
    out.push_back(s);
    return;
  }
  case kObjColon:
    if (c == ':') {
      f.phase = kObjValueStart;
      out.push_back(s);
    }
    return;
  case kObjValueStart: {
    const int32_t value = f.pos >= 0 ? n.properties[size_t(f.pos)].value : n.additional;
    if (f.pos < 0) ++f.index;
    f.phase = kObjValue;
    startValue(s, value, c, out, depth + 1);
    return;
  }
  case kObjAfter:
    if (c == ',') {
      const bool more = !listed || nextProperties(n, f.index).first < n.properties.size();
      if (more) {
        f.phase = kObjNext;
        out.push_back(s);
      }
    } else {
      close();
    }
    return;
  }
}

void JsonMatcher::tryArray(Stack &s, unsigned char c, std::vector<Stack> &out, int depth) const {
  Frame &f = s.back();
  const JsonGrammar::Node &n = g_->node(f.node);
  auto close = [&]() {
    if (c != ']' || f.index < n.minCount) return;
    s.pop_back();
    childDone(s);
    out.push_back(s);
  };
  auto item = [&]() {
    if (n.maxCount >= 0 && f.index >= n.maxCount) return;
    f.phase = kArrValue;
    startValue(s, n.items, c, out, depth + 1);
  };
  switch (f.phase) {
  case kArrOpen:
    if (c == '[') {
      f.phase = kArrFirst;
      out.push_back(s);
    }
    return;
  case kArrFirst:
    if (c == ']') close();
    else item();
    return;
  case kArrNext: item(); return;
  case kArrAfter:
    if (c == ',') {
      if (n.maxCount < 0 || f.index < n.maxCount) {
        f.phase = kArrNext;
        out.push_back(s);
      }
    } else {
      close();
    }
    return;
  }
}

// Every stack `s` becomes after byte `c`, appended to `out`.
void JsonMatcher::feedStack(Stack s, unsigned char c, std::vector<Stack> &out, int depth) const {
  if (s.empty() || depth > kMaxExpansion) return; // a whole document takes no more bytes
  Frame &f = s.back();
  if (f.node < 0) { // the root value starts
    startValue(std::move(s), g_->root(), c, out, depth + 1);
    return;
  }
  const JsonGrammar::Node &n = g_->node(f.node);
  switch (n.kind) {
  case Kind::Literal: {
    const std::string &lit = n.literals[size_t(f.index)];
    if (static_cast<unsigned char>(lit[size_t(f.pos)]) != c) return;
    if (size_t(++f.pos) == lit.size()) {
      s.pop_back();
      childDone(s);
    }
    out.push_back(std::move(s));
    return;
  }
  case Kind::String: {
    bool closed = false;
    if (!stringNext(f, n, c, closed)) return;
    if (closed) {
      s.pop_back();
      childDone(s);
    }
    out.push_back(std::move(s));
    return;
  }
  case Kind::Number:
  case Kind::Integer: {
    if (numberGoesOn(f, n, c)) {
      out.push_back(std::move(s));
      return;
    }
    if (!numberEnds(f, n)) return;
    s.pop_back(); // the number ended before `c`, which goes to what holds it
    childDone(s);
    feedStack(std::move(s), c, out, depth + 1);
    return;
  }
  case Kind::Object: tryObject(s, c, out, depth); return;
  case Kind::Array: tryArray(s, c, out, depth); return;
  case Kind::Union: return; // never a frame: expanded by startValue
  }
}

bool JsonMatcher::step(std::vector<Stack> &stacks, unsigned char c) const {
  starts_ = 0;
  std::vector<Stack> out;
  for (const Stack &s : stacks) feedStack(s, c, out, 0);
  std::vector<Stack> unique;
  for (Stack &s : out)
    if (unique.size() < kMaxReadings && std::find(unique.begin(), unique.end(), s) == unique.end())
      unique.push_back(std::move(s));
  stacks = std::move(unique);
  return !stacks.empty();
}

bool JsonMatcher::feed(std::string_view bytes) {
  std::vector<Stack> stacks = stacks_;
  for (char c : bytes)
    if (!step(stacks, static_cast<unsigned char>(c))) return false;
  stacks_ = std::move(stacks);
  return true;
}

bool JsonMatcher::accepts(std::string_view bytes) const {
  std::vector<Stack> stacks = stacks_;
  for (char c : bytes)
    if (!step(stacks, static_cast<unsigned char>(c))) return false;
  return true;
}

bool JsonMatcher::canEnd() const {
  for (const Stack &s : stacks_) {
    if (s.empty()) return true;
    // A number at the root ends where the text does.
    if (s.size() == 2 && s[0].node < 0 && (g_->node(s[1].node).kind == Kind::Number ||
                                           g_->node(s[1].node).kind == Kind::Integer) &&
        numberEnds(s[1], g_->node(s[1].node)))
      return true;
  }
  return false;
}

bool JsonMatcher::finished() const {
  return !stacks_.empty() && std::all_of(stacks_.begin(), stacks_.end(), [](const Stack &s) { return s.empty(); });
}

std::pair<int64_t, int64_t> JsonMatcher::plainStringRoom() const {
  int64_t fewest = INT64_MAX, most = 0;
  for (const Stack &s : stacks_) {
    if (s.empty() || s.back().node < 0) return {-1, -1};
    const JsonGrammar::Node &n = g_->node(s.back().node);
    if (n.kind != Kind::String || s.back().phase != kStrBody || n.pattern) return {-1, -1};
    const int64_t room = n.maxCount >= 0 ? n.maxCount - s.back().index : INT64_MAX;
    fewest = std::min(fewest, room);
    most = std::max(most, room);
  }
  if (stacks_.empty()) return {-1, -1};
  return {fewest, most};
}

// Whether stack `s` takes byte `c`, its frame `top` standing as `f` (a copy
// that may have moved on): feedStack's verdict without building the stacks.
bool JsonMatcher::takes(const Stack &s, size_t top, Frame f, unsigned char c) const {
  auto valueStarts = [&](int32_t node) { return top + 1 < kMaxDepth && g_->firstBytes(node).test(c); };
  if (f.node < 0) return valueStarts(g_->root());
  const JsonGrammar::Node &n = g_->node(f.node);
  switch (n.kind) {
  case Kind::Literal: return static_cast<unsigned char>(n.literals[size_t(f.index)][size_t(f.pos)]) == c;
  case Kind::String: {
    bool closed = false;
    return stringNext(f, n, c, closed);
  }
  case Kind::Number:
  case Kind::Integer: {
    if (numberGoesOn(f, n, c)) return true;
    if (!numberEnds(f, n) || top == 0) return false;
    Frame parent = s[top - 1]; // the number ends; what holds it moves on and takes `c`
    if (parent.node < 0) return false; // a root number: nothing follows it
    if (g_->node(parent.node).kind == Kind::Array) ++parent.index;
    parent.phase = g_->node(parent.node).kind == Kind::Array ? uint8_t(kArrAfter) : uint8_t(kObjAfter);
    return takes(s, top - 1, parent, c);
  }
  case Kind::Object: {
    const bool listed = n.additional < 0;
    const bool keyStarts = c == '"' && (!listed || nextProperties(n, f.index).first < n.properties.size());
    const bool closes = c == '}' && !(listed && requiredLeft(n, f.index));
    switch (f.phase) {
    case kObjOpen: return c == '{';
    case kObjFirst: return closes || keyStarts;
    case kObjNext: return keyStarts;
    case kObjKey: return static_cast<unsigned char>(n.properties[size_t(f.pos)].key[size_t(f.sub)]) == c;
    case kObjColon: return c == ':';
    case kObjValueStart: return valueStarts(f.pos >= 0 ? n.properties[size_t(f.pos)].value : n.additional);
    case kObjAfter:
      return closes || (c == ',' && (!listed || nextProperties(n, f.index).first < n.properties.size()));
    }
    return false;
  }
  case Kind::Array: {
    const bool room = n.maxCount < 0 || f.index < n.maxCount;
    const bool closes = c == ']' && f.index >= n.minCount;
    switch (f.phase) {
    case kArrOpen: return c == '[';
    case kArrFirst: return closes || (room && valueStarts(n.items));
    case kArrNext: return room && valueStarts(n.items);
    case kArrAfter: return closes || (c == ',' && room);
    }
    return false;
  }
  case Kind::Union: return false;
  }
  return false;
}

std::bitset<256> JsonMatcher::nextBytes() const {
  std::bitset<256> out;
  for (const Stack &s : stacks_)
    if (!s.empty())
      for (int c = 0; c < 256; ++c)
        if (!out.test(size_t(c)) && takes(s, s.size() - 1, s.back(), static_cast<unsigned char>(c))) out.set(size_t(c));
  return out;
}

bool JsonMatcher::mayTake(unsigned char c) const {
  for (const Stack &s : stacks_)
    if (!s.empty() && takes(s, s.size() - 1, s.back(), c)) return true;
  return false;
}

} // namespace sd::generate
