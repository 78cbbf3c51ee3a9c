// Regular expressions for JSON Schema patterns: parsed to a tree, counted
// repeats unrolled, then Glushkov's construction (first, last and follow
// sets of positions; no epsilon states).
#include "sd/generate/pattern.h"
#include "sd/generate/json_grammar.h"
#include <algorithm>

namespace sd::generate {

static_assert(sizeof(Pattern::State) == sizeof(PatternState) && Pattern::kMaxPositions + 1 == 128,
              "the matcher's frames hold a Pattern::State");

namespace {

using Ranges = Pattern::Ranges;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto &[lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  return out;
}

Ranges complement(const Ranges &r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto &[lo, hi] : normalized(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{9, 13}, {32, 32}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                       {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kDot = complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}); // ECMA's . : not a line end

struct Node {
  enum class Kind { Empty, Class, Concat, Alt, Star, Plus, Opt, Repeat } kind = Kind::Empty;
  Ranges ranges;              // Class
  std::vector<Node> children; // Concat, Alt; one for Star, Plus, Opt, Repeat
  int min = 0, max = -1;      // Repeat (-1: no bound)
  int position = -1;          // Class, once numbered
};

class Parser {
public:
  explicit Parser(std::vector<uint32_t> cps) : s_(std::move(cps)) {}

  Node parse() {
    Node n = alternation();
    if (at_ < s_.size()) fail("an unmatched ')'");
    return n;
  }
  std::string error;

private:
  void fail(const std::string &what) {
    if (error.empty()) error = what + " at character " + std::to_string(at_ + 1);
    at_ = s_.size();
  }
  bool more() const { return at_ < s_.size() && error.empty(); }
  uint32_t peek() const { return at_ < s_.size() ? s_[at_] : 0; }

  Node alternation() {
    Node alt;
    alt.kind = Node::Kind::Alt;
    alt.children.push_back(concatenation());
    while (more() && peek() == '|') {
      ++at_;
      alt.children.push_back(concatenation());
    }
    return alt.children.size() == 1 ? std::move(alt.children[0]) : alt;
  }

  Node concatenation() {
    Node cat;
    cat.kind = Node::Kind::Concat;
    while (more() && peek() != '|' && peek() != ')') cat.children.push_back(repeated());
    if (cat.children.empty()) return Node();
    return cat.children.size() == 1 ? std::move(cat.children[0]) : cat;
  }

  bool number(int &out) {
    size_t start = at_;
    int64_t v = 0;
    while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9' && v < 100000) v = v * 10 + (s_[at_++] - '0');
    if (at_ == start) return false; // no digits: `out` keeps its value
    out = int(v);
    return true;
  }

  Node repeated() {
    Node n = atom();
    while (more()) {
      const uint32_t c = peek();
      Node r;
      r.children.push_back(std::move(n));
      if (c == '*') r.kind = Node::Kind::Star;
      else if (c == '+') r.kind = Node::Kind::Plus;
      else if (c == '?') r.kind = Node::Kind::Opt;
      else if (c == '{') {
        const size_t back = at_;
        ++at_;
        r.kind = Node::Kind::Repeat;
        if (!number(r.min)) { // not a quantifier: a literal '{' (as ECMA's Annex B reads it)
          at_ = back;
          return std::move(r.children[0]);
        }
        r.max = r.min;
        if (peek() == ',') {
          ++at_;
          r.max = -1;
          number(r.max);
        }
        if (peek() != '}') return fail("an unclosed {n,m}"), Node();
        if (r.max >= 0 && r.max < r.min) return fail("{n,m} with m < n"), Node();
      } else {
        return std::move(r.children[0]);
      }
      ++at_;
      if (more() && peek() == '?') ++at_; // lazy: the same strings match
      n = std::move(r);
    }
    return n;
  }

  Node literal(Ranges r) {
    Node n;
    n.kind = Node::Kind::Class;
    n.ranges = normalized(std::move(r));
    return n;
  }

  // The code point or class after a backslash; false (error set) when unsupported.
  bool escape(Ranges &out, bool inClass) {
    if (at_ >= s_.size()) return fail("a trailing backslash"), false;
    const uint32_t c = s_[at_++];
    auto hex = [&](int digits) {
      uint32_t v = 0;
      for (int k = 0; k < digits; ++k) {
        const uint32_t h = peek();
        const int d = h >= '0' && h <= '9' ? int(h - '0') : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
                      : h >= 'A' && h <= 'F' ? int(h - 'A' + 10) : -1;
        if (d < 0) return fail("a bad \\x or \\u escape"), 0u;
        v = v * 16 + uint32_t(d);
        ++at_;
      }
      return v;
    };
    switch (c) {
    case 'd': out = kDigit; return true;
    case 'D': out = complement(kDigit); return true;
    case 'w': out = kWord; return true;
    case 'W': out = complement(kWord); return true;
    case 's': out = kSpace; return true;
    case 'S': out = complement(kSpace); return true;
    case 't': out = {{9, 9}}; return true;
    case 'n': out = {{10, 10}}; return true;
    case 'v': out = {{11, 11}}; return true;
    case 'f': out = {{12, 12}}; return true;
    case 'r': out = {{13, 13}}; return true;
    case '0': out = {{0, 0}}; return true;
    case 'x': {
      const uint32_t v = hex(2);
      out = {{v, v}};
      return error.empty();
    }
    case 'u': {
      const uint32_t v = hex(4);
      out = {{v, v}};
      return error.empty();
    }
    case 'b':
      if (inClass) {
        out = {{8, 8}};
        return true;
      }
      break;
    default:
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
        out = {{c, c}}; // escaped punctuation stands for itself
        return true;
      }
    }
    --at_;
    fail(std::string("the escape \\") + char(c < 128 ? c : '?') + " (not supported)");
    return false;
  }

  Node bracket() {
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++at_;
    }
    Ranges r;
    bool first = true;
    while (at_ < s_.size() && (peek() != ']' || first)) {
      first = false;
      Ranges one;
      uint32_t c = s_[at_++];
      if (c == '\\') {
        if (!escape(one, true)) return Node();
      } else {
        one = {{c, c}};
      }
      if (one.size() == 1 && one[0].first == one[0].second && peek() == '-' && at_ + 1 < s_.size() &&
          s_[at_ + 1] != ']') { // a range a-z
        ++at_;
        Ranges hi;
        uint32_t d = s_[at_++];
        if (d == '\\') {
          if (!escape(hi, true)) return Node();
        } else {
          hi = {{d, d}};
        }
        if (hi.size() != 1 || hi[0].first != hi[0].second || hi[0].first < one[0].first)
          return fail("a bad range in [...]"), Node();
        one = {{one[0].first, hi[0].first}};
      }
      r.insert(r.end(), one.begin(), one.end());
    }
    if (at_ >= s_.size()) return fail("an unclosed ["), Node();
    ++at_; // ]
    return literal(negated ? complement(r) : r);
  }

  Node atom() {
    const uint32_t c = s_[at_++];
    switch (c) {
    case '(': {
      if (peek() == '?') {
        if (at_ + 1 < s_.size() && s_[at_ + 1] == ':') at_ += 2;
        else return fail("(?...) other than (?:...) (lookaround, named groups: not supported)"), Node();
      }
      Node inner = alternation();
      if (peek() != ')') return fail("an unclosed ("), Node();
      ++at_;
      return inner;
    }
    case '[': return bracket();
    case '.': return literal(kDot);
    case '\\': {
      Ranges r;
      if (!escape(r, false)) return Node();
      return literal(r);
    }
    case '^':
    case '$': return fail("^ or $ other than at the pattern's ends"), Node();
    case '*':
    case '+':
    case '?': return fail("a quantifier with nothing before it"), Node();
    case ')': return fail("an unmatched ')'"), Node();
    default: return literal({{c, c}});
    }
  }

  std::vector<uint32_t> s_;
  size_t at_ = 0;
};

// The positions a tree has once its counted repeats are written out
// (saturating: a{99999} of a group is not built to be counted).
int64_t positions(const Node &n) {
  int64_t inner = 0;
  for (const Node &c : n.children) inner = std::min<int64_t>(inner + positions(c), 1 << 20);
  if (n.kind == Node::Kind::Class) return 1;
  if (n.kind != Node::Kind::Repeat) return inner;
  const int64_t copies = n.max >= 0 ? n.max : n.min + 1;
  return std::min<int64_t>(inner * copies, 1 << 20);
}

// Counted repeats as copies: a{2,4} -> a a a? a?; a{2,} -> a a a*.
Node unrolled(const Node &n) {
  Node out = n;
  for (Node &c : out.children) c = unrolled(c);
  if (n.kind != Node::Kind::Repeat) return out;
  const Node &body = out.children[0];
  Node cat;
  cat.kind = Node::Kind::Concat;
  for (int k = 0; k < n.min; ++k) cat.children.push_back(body);
  if (n.max < 0) {
    Node star;
    star.kind = Node::Kind::Star;
    star.children.push_back(body);
    cat.children.push_back(std::move(star));
  } else {
    for (int k = n.min; k < n.max; ++k) {
      Node opt;
      opt.kind = Node::Kind::Opt;
      opt.children.push_back(body);
      cat.children.push_back(std::move(opt));
    }
  }
  return cat;
}

std::vector<uint32_t> codePoints(const std::string &s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n && i + size_t(k) < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + size_t(k)]) & 0x3F);
    out.push_back(cp);
    i += size_t(n);
  }
  return out;
}

} // namespace

struct PatternBuilder {
  Pattern &p;
  struct Sets {
    bool nullable = true;
    Pattern::State first, last;
  };
  bool overflow = false;

  Sets build(Node &n) {
    Sets s;
    switch (n.kind) {
    case Node::Kind::Empty: return s;
    case Node::Kind::Class: {
      if (p.classes_.size() >= size_t(Pattern::kMaxPositions)) { // the last bit is the start's
        overflow = true;
        return s;
      }
      n.position = int(p.classes_.size());
      p.classes_.push_back(n.ranges);
      p.follow_.emplace_back();
      s.nullable = false;
      s.first.set(size_t(n.position));
      s.last.set(size_t(n.position));
      return s;
    }
    case Node::Kind::Concat:
      for (Node &c : n.children) {
        Sets next = build(c);
        link(s.last, next.first);
        if (s.nullable) s.first |= next.first;
        s.last = next.nullable ? (s.last | next.last) : next.last;
        s.nullable = s.nullable && next.nullable;
      }
      return s;
    case Node::Kind::Alt:
      s.nullable = false;
      for (Node &c : n.children) {
        Sets next = build(c);
        s.nullable = s.nullable || next.nullable;
        s.first |= next.first;
        s.last |= next.last;
      }
      return s;
    case Node::Kind::Star:
    case Node::Kind::Plus:
    case Node::Kind::Opt: {
      Sets inner = build(n.children[0]);
      if (n.kind != Node::Kind::Opt) link(inner.last, inner.first);
      inner.nullable = inner.nullable || n.kind != Node::Kind::Plus;
      return inner;
    }
    case Node::Kind::Repeat: return s; // unrolled before
    }
    return s;
  }

  void link(const Pattern::State &from, const Pattern::State &to) {
    for (size_t q = 0; q < p.follow_.size() && q < size_t(Pattern::kMaxPositions); ++q)
      if (from.test(q)) p.follow_[q] |= to;
  }
};

StatusOr<std::shared_ptr<const Pattern>> Pattern::compile(const std::string &regex, Match match) {
  std::string body = regex;
  const bool anchoredStart = match == Match::Whole || (!body.empty() && body[0] == '^');
  if (!body.empty() && body[0] == '^') body.erase(0, 1);
  size_t slashes = 0; // a final $ anchors the end unless an odd run of backslashes escapes it
  for (size_t i = body.size() - std::min<size_t>(body.size(), 1); i-- > 0 && body[i] == '\\';) ++slashes;
  const bool endsInAnchor = !body.empty() && body.back() == '$' && slashes % 2 == 0;
  if (endsInAnchor) body.pop_back();
  const bool anchoredEnd = match == Match::Whole || endsInAnchor;
  Parser parser(codePoints(body));
  Node tree = parser.parse();
  if (!parser.error.empty()) return sdError("pattern '", regex.substr(0, 80), "': ", parser.error);
  auto tooLong = [&] {
    return sdError("pattern '", regex.substr(0, 80), "' is too long: more than ", kMaxPositions - 2,
                   " characters once its counted repeats are written out");
  };
  if (positions(tree) > kMaxPositions - 2) return tooLong(); // two more: the unanchored ends' any-text
  // Unanchored ends match anywhere: any text before and after.
  Node any;
  any.kind = Node::Kind::Star;
  Node all;
  all.kind = Node::Kind::Class;
  all.ranges = {{0, kMaxCodePoint}};
  any.children.push_back(all);
  Node whole;
  whole.kind = Node::Kind::Concat;
  if (!anchoredStart) whole.children.push_back(any);
  whole.children.push_back(unrolled(tree));
  if (!anchoredEnd) whole.children.push_back(any);
  auto p = std::make_shared<Pattern>();
  PatternBuilder b{*p};
  PatternBuilder::Sets sets = b.build(whole);
  if (b.overflow) return tooLong();
  p->first_ = sets.first;
  p->last_ = sets.last;
  p->nullable_ = sets.nullable;
  return std::shared_ptr<const Pattern>(std::move(p));
}

Pattern::State Pattern::start() const {
  State s;
  s.set(kStartBit);
  return s;
}

namespace {
bool contains(const Ranges &r, uint32_t cp) {
  for (const auto &[lo, hi] : r)
    if (cp >= lo && cp <= hi) return true;
  return false;
}
bool overlaps(const Ranges &r, uint32_t lo, uint32_t hi) {
  for (const auto &[a, b] : r)
    if (a <= hi && lo <= b) return true;
  return false;
}
} // namespace

Pattern::State Pattern::step(const State &s, uint32_t cp) const {
  State candidates = s.test(kStartBit) ? first_ : State();
  for (size_t q = 0; q < follow_.size(); ++q)
    if (s.test(q)) candidates |= follow_[q];
  State out;
  for (size_t q = 0; q < classes_.size(); ++q)
    if (candidates.test(q) && contains(classes_[q], cp)) out.set(q);
  return out;
}

bool Pattern::mayStep(const State &s, uint32_t lo, uint32_t hi) const {
  State candidates = s.test(kStartBit) ? first_ : State();
  for (size_t q = 0; q < follow_.size(); ++q)
    if (s.test(q)) candidates |= follow_[q];
  for (size_t q = 0; q < classes_.size(); ++q)
    if (candidates.test(q) && overlaps(classes_[q], lo, hi)) return true;
  return false;
}

bool Pattern::accepts(const State &s) const { return (s.test(kStartBit) && nullable_) || (s & last_).any(); }

} // namespace sd::generate
