// Recursive-descent JSON parser with a depth limit.
#include "sd/format/json.h"
#include <unordered_map>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>

namespace sd {
namespace {

class Parser {
public:
  Parser(const std::string &s, const std::string &what) : s_(s), what_(what) {}
  Status parse(Json &out) {
    SD_RETURN_IF_ERROR(value(out, 0));
    skipWs();
    if (pos_ != s_.size()) return fail("trailing characters");
    return Status::ok();
  }

private:
  Status fail(const std::string &msg) {
    return sdError(what_, ": invalid JSON at offset ", pos_, ": ", msg);
  }
  void skipWs() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool lit(const char *w) {
    size_t n = std::strlen(w);
    if (s_.compare(pos_, n, w) != 0) return false;
    pos_ += n;
    return true;
  }
  Status value(Json &out, int depth) {
    if (depth > 64) return fail("nesting too deep");
    skipWs();
    if (pos_ >= s_.size()) return fail("unexpected end");
    char c = s_[pos_];
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') { out.type = Json::Type::String; return string(out.str); }
    if (lit("true")) { out.type = Json::Type::Bool; out.b = true; return Status::ok(); }
    if (lit("false")) { out.type = Json::Type::Bool; out.b = false; return Status::ok(); }
    if (lit("null")) { out.type = Json::Type::Null; return Status::ok(); }
    return number(out);
  }
  Status number(Json &out) {
    // JSON's grammar, strictly: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
    size_t start = pos_;
    auto digits = [&] {
      size_t from = pos_;
      while (pos_ < s_.size() && isdigit((unsigned char)s_[pos_])) ++pos_;
      return pos_ - from;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    const size_t intStart = pos_;
    const size_t intDigits = digits();
    if (!intDigits) return fail(start == pos_ ? "unexpected character" : "bad number");
    if (intDigits > 1 && s_[intStart] == '0') return fail("bad number (a leading zero)");
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) return fail("bad number (no digit after '.')");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) return fail("bad number (no exponent digits)");
    }
    std::string tok = s_.substr(start, pos_ - start);
    char *end = nullptr;
    out.num = std::strtod(tok.c_str(), &end);
    if (!end || *end) return fail("bad number '" + tok + "'");
    // 1e999 would be inf: no config, header or data line means that.
    if (!std::isfinite(out.num)) return fail("number '" + tok + "' is out of range");
    out.type = Json::Type::Number;
    return Status::ok();
  }
  bool hex4(size_t at) const {
    if (at + 4 > s_.size()) return false;
    for (size_t i = at; i < at + 4; ++i)
      if (!isxdigit((unsigned char)s_[i])) return false;
    return true;
  }
  Status string(std::string &out) {
    ++pos_;
    out.clear();
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return Status::ok();
      if (c != '\\') { out += c; continue; }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        if (!hex4(pos_)) return fail("bad \\u escape (four hex digits)");
        unsigned cp = unsigned(std::strtoul(s_.substr(pos_, 4).c_str(), nullptr, 16));
        pos_ += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF && s_.compare(pos_, 2, "\\u") == 0 && hex4(pos_ + 2)) {
          unsigned lo = unsigned(std::strtoul(s_.substr(pos_ + 2, 4).c_str(), nullptr, 16));
          if (lo >= 0xDC00 && lo <= 0xDFFF) { cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00); pos_ += 6; }
        }
        if (cp < 0x80) out += char(cp);
        else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) { out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
        else { out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
        break;
      }
      case '"': case '\\': case '/': out += e; break;
      default: return fail(std::string("bad escape '\\") + e + "'");
      }
    }
    return fail("unterminated string");
  }
  Status array(Json &out, int depth) {
    out.type = Json::Type::Array;
    ++pos_;
    skipWs();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return Status::ok(); }
    for (;;) {
      out.arr.emplace_back();
      SD_RETURN_IF_ERROR(value(out.arr.back(), depth + 1));
      skipWs();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return Status::ok(); }
      return fail("expected ',' or ']'");
    }
  }
  Status object(Json &out, int depth) {
    out.type = Json::Type::Object;
    std::unordered_map<std::string, size_t> index;
    ++pos_;
    skipWs();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return Status::ok(); }
    for (;;) {
      skipWs();
      if (pos_ >= s_.size() || s_[pos_] != '"') return fail("expected a key");
      std::string key;
      SD_RETURN_IF_ERROR(string(key));
      skipWs();
      if (pos_ >= s_.size() || s_[pos_] != ':') return fail("expected ':'");
      ++pos_;
      // A repeated key takes its last value at its first position, as
      // Python's json does, so configs read the same here and in PEFT.
      // (Indexed by a hash map, so a header with a million keys stays linear.)
      Json v;
      SD_RETURN_IF_ERROR(value(v, depth + 1));
      auto [at, fresh] = index.emplace(key, out.obj.size());
      if (!fresh) out.obj[at->second].second = std::move(v);
      else out.obj.emplace_back(std::move(key), std::move(v));
      skipWs();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return Status::ok(); }
      return fail("expected ',' or '}'");
    }
  }
  const std::string &s_;
  std::string what_;
  size_t pos_ = 0;
};

} // namespace

const Json *Json::get(const std::string &key) const {
  for (auto &e : obj)
    if (e.first == key) return &e.second;
  return nullptr;
}

bool Json::isInteger() const {
  return type == Type::Number && std::floor(num) == num && std::abs(num) < 9.007199254740992e15;
}

StatusOr<Json> parseJson(const std::string &text, const std::string &what) {
  Json j;
  Parser p(text, what);
  Status s = p.parse(j);
  if (!s.isOk()) return s;
  return j;
}

std::string jsonNumber(double v) {
  char buf[32];
  // The shortest of %.15g (0.1 as "0.1") and %.17g that reads back as v.
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string jsonQuote(const std::string &s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') { o += '\\'; o += c; }
    else if (c == '\n') o += "\\n";
    else if ((unsigned char)c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
    else o += c;
  }
  return o + "\"";
}

std::string jsonCompact(const Json &v) {
  switch (v.type) {
  case Json::Type::Null: return "null";
  case Json::Type::Bool: return v.b ? "true" : "false";
  case Json::Type::Number: return jsonNumber(v.num);
  case Json::Type::String: return jsonQuote(v.str);
  case Json::Type::Array: {
    std::string s = "[";
    for (size_t i = 0; i < v.arr.size(); ++i) s += (i ? "," : "") + jsonCompact(v.arr[i]);
    return s + "]";
  }
  case Json::Type::Object: {
    std::string s = "{";
    for (size_t i = 0; i < v.obj.size(); ++i)
      s += (i ? "," : "") + jsonQuote(v.obj[i].first) + ":" + jsonCompact(v.obj[i].second);
    return s + "}";
  }
  }
  return "null";
}

} // namespace sd
