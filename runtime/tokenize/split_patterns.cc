// The split patterns as hand-written matchers over code points: at each
// position the first alternative that matches wins, and each quantifier is
// greedy with the backtracking the pattern needs (the (?!\S) lookahead, the
// [\r\n]+ after \s*), as in the regex engines the tokenizers library uses.
#include "split_patterns.h"
#include "unicode.h"

namespace sd::tok {
namespace {

enum class Kind { Letter, Number, Space, Other };

Kind kindOf(char32_t cp) {
  if (isWhitespace(cp)) return Kind::Space;
  if (isLetter(cp)) return Kind::Letter;
  if (isNumber(cp)) return Kind::Number;
  return Kind::Other;
}

// `text` as code points with their kinds and byte offsets (one past the end last).
struct Decoded {
  std::string_view text;
  std::vector<char32_t> cps;
  std::vector<Kind> kinds;
  std::vector<size_t> at;
  explicit Decoded(std::string_view t) : text(t) {
    for (size_t i = 0; i < t.size();) {
      at.push_back(i);
      cps.push_back(nextCodePoint(t, i));
      kinds.push_back(kindOf(cps.back()));
    }
    at.push_back(t.size());
  }
  size_t size() const { return cps.size(); }
  // End of the run of `kd` starting at k.
  size_t run(size_t k, Kind kd) const {
    while (k < size() && kinds[k] == kd) ++k;
    return k;
  }
  // The end of 's 't 're 've 'm 'll 'd at i (letters of any case if
  // anyCase), or i when there is none.
  size_t contraction(size_t i, bool anyCase) const {
    if (cps[i] != '\'' || i + 1 >= size()) return i;
    auto lower = [&](size_t k) -> char32_t {
      if (k >= size()) return 0;
      char32_t c = cps[k];
      if (anyCase && c == 0x17F) return 's'; // LATIN SMALL LETTER LONG S case-folds to s
      return anyCase && c >= 'A' && c <= 'Z' ? c + 32 : c;
    };
    char32_t a = lower(i + 1), b = lower(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return i;
  }
  // \s+(?!\S) at whitespace i: the run, less its last character when a
  // non-space follows it; else (a single space before a non-space) \s+.
  size_t spaces(size_t i) const {
    size_t stop = run(i, Kind::Space);
    return stop < size() && stop - i > 1 ? stop - 1 : stop;
  }
  std::string_view piece(size_t b, size_t e) const { return text.substr(at[b], at[e] - at[b]); }
};

bool isNewline(char32_t c) { return c == '\r' || c == '\n'; }

} // namespace

std::vector<std::string_view> splitGpt2(std::string_view text) {
  const Decoded d(text);
  const size_t n = d.size();
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < n;) {
    size_t end = d.contraction(i, false);
    if (end == i) {
      // ` ?X+` for X a letter, a number or other (not space, letter, number).
      size_t k = d.cps[i] == ' ' && i + 1 < n && d.kinds[i + 1] != Kind::Space ? i + 1 : i;
      end = d.kinds[k] != Kind::Space ? d.run(k, d.kinds[k]) : d.spaces(i);
    }
    pieces.push_back(d.piece(i, end));
    i = end;
  }
  return pieces;
}

std::vector<std::string_view> splitLlama3(std::string_view text, int maxDigits) {
  const Decoded d(text);
  const size_t n = d.size();
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < n;) {
    const Kind kd = d.kinds[i];
    size_t end = d.contraction(i, true);
    if (end != i) {
    } else if (kd == Kind::Letter) { // [^\r\n\p{L}\p{N}]?\p{L}+ without its optional character
      end = d.run(i, Kind::Letter);
    } else if (kd != Kind::Number && !isNewline(d.cps[i]) && i + 1 < n && d.kinds[i + 1] == Kind::Letter) {
      end = d.run(i + 1, Kind::Letter); // ... with it: one non-letter, non-number, non-newline first
    } else if (kd == Kind::Number) { // \p{N}{1,D}
      end = i;
      while (end < n && end - i < size_t(maxDigits) && d.kinds[end] == Kind::Number) ++end;
    } else if (kd == Kind::Other || (d.cps[i] == ' ' && i + 1 < n && d.kinds[i + 1] == Kind::Other)) {
      // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
      end = d.run(kd == Kind::Other ? i : i + 1, Kind::Other);
      while (end < n && isNewline(d.cps[end])) ++end;
    } else {
      // Whitespace: \s*[\r\n]+ up to the run's last newline, else \s+(?!\S), else \s+.
      size_t stop = d.run(i, Kind::Space), lastNewline = i;
      for (size_t k = i; k < stop; ++k)
        if (isNewline(d.cps[k])) lastNewline = k + 1;
      end = lastNewline > i ? lastNewline : d.spaces(i);
    }
    pieces.push_back(d.piece(i, end));
    i = end;
  }
  return pieces;
}

} // namespace sd::tok
