// A small Jinja interpreter for chat templates: source -> segments (with
// jinja2's trim_blocks / lstrip_blocks and "-" whitespace control) -> a tree
// of statements and expressions -> text. Values are Python-like (None,
// bools, ints, floats, strings, lists, dicts), with jinja's Undefined for
// missing names and keys (empty when printed, false when tested).
#include "sd/tokenize/chat_template.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <functional>

namespace sd {
namespace {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

struct Value {
  enum class T { Undefined, None, Bool, Int, Float, Str, List, Dict } t = T::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> l; // shared, as Python lists are
  std::shared_ptr<Dict> d; // shared: namespace() attributes are set in place

  static Value none() { return withType(T::None); }
  static Value boolean(bool v) { Value x = withType(T::Bool); x.b = v; return x; }
  static Value integer(int64_t v) { Value x = withType(T::Int); x.i = v; return x; }
  static Value real(double v) { Value x = withType(T::Float); x.f = v; return x; }
  static Value str(std::string v) { Value x = withType(T::Str); x.s = std::move(v); return x; }
  static Value list(List v = {}) { Value x = withType(T::List); x.l = std::make_shared<List>(std::move(v)); return x; }
  static Value dict(Dict v = {}) { Value x = withType(T::Dict); x.d = std::make_shared<Dict>(std::move(v)); return x; }
  static Value withType(T t) { Value x; x.t = t; return x; }

  bool truthy() const {
    switch (t) {
    case T::Undefined: case T::None: return false;
    case T::Bool: return b;
    case T::Int: return i != 0;
    case T::Float: return f != 0;
    case T::Str: return !s.empty();
    case T::List: return !l->empty();
    case T::Dict: return !d->empty();
    }
    return false;
  }
  const Value *find(const std::string &key) const {
    if (t != T::Dict) return nullptr;
    for (const auto &[k, v] : *d)
      if (k == key) return &v;
    return nullptr;
  }
};

std::string repr(const Value &v);

std::string pyFloat(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", f);
  for (int p = 1; p <= 17; ++p) { // shortest form that reads back, as Python prints
    std::snprintf(buf, sizeof buf, "%.*g", p, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";
  return s;
}

// How {{ v }} prints v.
std::string toText(const Value &v) {
  switch (v.t) {
  case Value::T::Undefined: return "";
  case Value::T::None: return "None";
  case Value::T::Bool: return v.b ? "True" : "False";
  case Value::T::Int: return std::to_string(v.i);
  case Value::T::Float: return pyFloat(v.f);
  case Value::T::Str: return v.s;
  default: return repr(v);
  }
}

std::string quote(const std::string &s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'' || c == '\\') out += '\\';
    if (c == '\n') out += "\\n";
    else out += c;
  }
  return out + "'";
}

std::string repr(const Value &v) {
  if (v.t == Value::T::Str) return quote(v.s);
  if (v.t == Value::T::List) {
    std::string out = "[";
    for (size_t k = 0; k < v.l->size(); ++k) out += (k ? ", " : "") + repr((*v.l)[k]);
    return out + "]";
  }
  if (v.t == Value::T::Dict) {
    std::string out = "{";
    for (size_t k = 0; k < v.d->size(); ++k) out += (k ? ", " : "") + quote((*v.d)[k].first) + ": " + repr((*v.d)[k].second);
    return out + "}";
  }
  return toText(v);
}

// json.dumps(v, ensure_ascii=False), as transformers' tojson filter.
std::string toJson(const Value &v) {
  switch (v.t) {
  case Value::T::Undefined: case Value::T::None: return "null";
  case Value::T::Bool: return v.b ? "true" : "false";
  case Value::T::Int: return std::to_string(v.i);
  case Value::T::Float: return pyFloat(v.f);
  case Value::T::Str: {
    std::string out = "\"";
    for (unsigned char c : v.s) {
      switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
      }
    }
    return out + "\"";
  }
  case Value::T::List: {
    std::string out = "[";
    for (size_t k = 0; k < v.l->size(); ++k) out += (k ? ", " : "") + toJson((*v.l)[k]);
    return out + "]";
  }
  case Value::T::Dict: {
    std::string out = "{";
    for (size_t k = 0; k < v.d->size(); ++k)
      out += (k ? ", " : "") + toJson(Value::str((*v.d)[k].first)) + ": " + toJson((*v.d)[k].second);
    return out + "}";
  }
  }
  return "null";
}

bool isNumber(const Value &v) { return v.t == Value::T::Int || v.t == Value::T::Float || v.t == Value::T::Bool; }
double numberOf(const Value &v) { return v.t == Value::T::Float ? v.f : v.t == Value::T::Bool ? double(v.b) : double(v.i); }
// An integer or bool's exact value.
int64_t intOf(const Value &v) { return v.t == Value::T::Bool ? int64_t(v.b) : v.i; }

bool equal(const Value &a, const Value &b) {
  if (isNumber(a) && isNumber(b)) return numberOf(a) == numberOf(b);
  if (a.t != b.t) return false;
  switch (a.t) {
  case Value::T::Str: return a.s == b.s;
  case Value::T::List:
    if (a.l->size() != b.l->size()) return false;
    for (size_t k = 0; k < a.l->size(); ++k)
      if (!equal((*a.l)[k], (*b.l)[k])) return false;
    return true;
  case Value::T::Dict: return a.d == b.d;
  default: return true; // Undefined, None
  }
}

// ---- expressions ----------------------------------------------------------

struct Expr {
  enum class K { Literal, Name, Attr, Index, Slice, Call, Filter, Test, Unary, Binary, Cond, ListLit, DictLit } k;
  Value literal;
  std::string name; // Name, Attr, Filter, Test; Unary/Binary operator
  std::vector<std::unique_ptr<Expr>> args;                       // operands and positional arguments
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs; // Call/Filter keyword arguments
  bool negated = false;                                          // Test: "is not"
};
using ExprPtr = std::unique_ptr<Expr>;

struct Token {
  enum class K { Name, Str, Int, Float, Op, End } k;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

struct Failure {
  std::string message;
};

class ExprParser {
public:
  ExprParser(const std::string &src, int line) : line_(line) { lex(src); }

  ExprPtr parseExpression() { return conditional(); }
  ExprPtr parseOr() { return orExpr(); }
  bool atEnd() const { return peek().k == Token::K::End; }
  bool acceptName(const char *n) {
    if (peek().k == Token::K::Name && peek().text == n) return ++pos_, true;
    return false;
  }
  bool acceptOp(const char *op) {
    if (peek().k == Token::K::Op && peek().text == op) return ++pos_, true;
    return false;
  }
  std::string expectName() {
    if (peek().k != Token::K::Name) fail("expected a name");
    return toks_[pos_++].text;
  }
  void expectOp(const char *op) {
    if (!acceptOp(op)) fail(std::string("expected '") + op + "'");
  }
  void expectEnd() {
    if (!atEnd()) fail("unexpected '" + peek().text + "'");
  }
  [[noreturn]] void fail(const std::string &what) const {
    throw Failure{"line " + std::to_string(line_) + ": " + what};
  }

private:
  const Token &peek(size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }

  void lex(const std::string &s) {
    for (size_t i = 0; i < s.size();) {
      char c = s[i];
      if (std::isspace(uint8_t(c))) { ++i; continue; }
      if (std::isalpha(uint8_t(c)) || c == '_') {
        size_t j = i;
        while (j < s.size() && (std::isalnum(uint8_t(s[j])) || s[j] == '_')) ++j;
        toks_.push_back({Token::K::Name, s.substr(i, j - i)});
        i = j;
      } else if (std::isdigit(uint8_t(c))) {
        size_t j = i;
        bool real = false;
        while (j < s.size() && (std::isdigit(uint8_t(s[j])) || (s[j] == '.' && !real && j + 1 < s.size() && std::isdigit(uint8_t(s[j + 1])))))
          real |= s[j++] == '.';
        Token t{real ? Token::K::Float : Token::K::Int, s.substr(i, j - i)};
        if (real) t.f = std::strtod(t.text.c_str(), nullptr);
        else t.i = std::strtoll(t.text.c_str(), nullptr, 10);
        toks_.push_back(t);
        i = j;
      } else if (c == '\'' || c == '"') {
        std::string v;
        size_t j = i + 1;
        for (; j < s.size() && s[j] != c; ++j) {
          if (s[j] != '\\' || j + 1 >= s.size()) { v += s[j]; continue; }
          char e = s[++j];
          v += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        }
        if (j >= s.size()) fail("unterminated string");
        toks_.push_back({Token::K::Str, v});
        i = j + 1;
      } else {
        static const char *ops[] = {"==", "!=", "<=", ">=", "//", "**", "(", ")", "[", "]", "{", "}", ".", ",", ":",
                                    "|", "~", "+", "-", "*", "/", "%", "<", ">", "="};
        bool found = false;
        for (const char *op : ops)
          if (s.compare(i, std::strlen(op), op) == 0) {
            toks_.push_back({Token::K::Op, op});
            i += std::strlen(op);
            found = true;
            break;
          }
        if (!found) fail(std::string("unexpected character '") + c + "'");
      }
    }
    toks_.push_back({Token::K::End, "end of expression"});
  }

  static ExprPtr make(Expr::K k, std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->name = std::move(name);
    return e;
  }
  static ExprPtr binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::K::Binary, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // Nesting is bounded, so a hostile template is an error, not a stack overflow.
  struct Depth {
    ExprParser &p;
    explicit Depth(ExprParser &parser) : p(parser) {
      if (++p.depth_ > 100) p.fail("expressions nested more than 100 deep");
    }
    ~Depth() { --p.depth_; }
  };

  ExprPtr conditional() {
    Depth guard(*this);
    ExprPtr value = orExpr();
    if (!acceptName("if")) return value;
    auto e = make(Expr::K::Cond);
    e->args.push_back(orExpr());
    e->args.push_back(std::move(value));
    e->args.push_back(acceptName("else") ? conditional() : make(Expr::K::Literal));
    return e;
  }
  ExprPtr orExpr() {
    ExprPtr e = andExpr();
    while (acceptName("or")) e = binary("or", std::move(e), andExpr());
    return e;
  }
  ExprPtr andExpr() {
    ExprPtr e = notExpr();
    while (acceptName("and")) e = binary("and", std::move(e), notExpr());
    return e;
  }
  ExprPtr notExpr() {
    Depth guard(*this);
    if (!acceptName("not")) return compare();
    auto e = make(Expr::K::Unary, "not");
    e->args.push_back(notExpr());
    return e;
  }
  ExprPtr compare() {
    ExprPtr e = concat();
    for (;;) {
      if (peek().k == Token::K::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                       peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        std::string op = toks_[pos_++].text;
        e = binary(op, std::move(e), concat());
      } else if (acceptName("in")) {
        e = binary("in", std::move(e), concat());
      } else if (peek().k == Token::K::Name && peek().text == "not" && peek(1).text == "in") {
        pos_ += 2;
        e = binary("not in", std::move(e), concat());
      } else if (acceptName("is")) {
        auto t = make(Expr::K::Test);
        t->negated = acceptName("not");
        t->name = expectName();
        t->args.push_back(std::move(e));
        if (peek().k == Token::K::Op && peek().text == "(") callArgs(*t);
        else if (peek().k == Token::K::Str || peek().k == Token::K::Int) t->args.push_back(primary()); // is divisibleby 3
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  ExprPtr concat() {
    ExprPtr e = additive();
    while (acceptOp("~")) e = binary("~", std::move(e), additive());
    return e;
  }
  ExprPtr additive() {
    ExprPtr e = multiplicative();
    for (;;) {
      if (acceptOp("+")) e = binary("+", std::move(e), multiplicative());
      else if (acceptOp("-")) e = binary("-", std::move(e), multiplicative());
      else return e;
    }
  }
  ExprPtr multiplicative() {
    ExprPtr e = unary();
    for (;;) {
      const char *ops[] = {"*", "//", "/", "%"};
      bool matched = false;
      for (const char *op : ops)
        if (acceptOp(op)) {
          e = binary(op, std::move(e), unary());
          matched = true;
          break;
        }
      if (!matched) return e;
    }
  }
  ExprPtr unary() {
    Depth guard(*this);
    if (acceptOp("-")) {
      auto e = make(Expr::K::Unary, "-");
      e->args.push_back(unary());
      return e;
    }
    return postfix();
  }
  void callArgs(Expr &call) {
    expectOp("(");
    while (!acceptOp(")")) {
      if (peek().k == Token::K::Name && peek(1).k == Token::K::Op && peek(1).text == "=") {
        std::string key = toks_[pos_].text;
        pos_ += 2;
        call.kwargs.emplace_back(key, parseExpression());
      } else {
        call.args.push_back(parseExpression());
      }
      if (!acceptOp(",")) {
        expectOp(")");
        break;
      }
    }
  }
  ExprPtr postfix() {
    ExprPtr e = primary();
    for (;;) {
      if (acceptOp(".")) {
        auto a = make(Expr::K::Attr, expectName());
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (acceptOp("[")) {
        ExprPtr lo, hi, step;
        bool slice = false;
        if (!(peek().k == Token::K::Op && peek().text == ":")) lo = parseExpression();
        if (acceptOp(":")) {
          slice = true;
          if (!(peek().k == Token::K::Op && (peek().text == "]" || peek().text == ":"))) hi = parseExpression();
          if (acceptOp(":") && !(peek().k == Token::K::Op && peek().text == "]")) step = parseExpression();
        }
        expectOp("]");
        auto ix = make(slice ? Expr::K::Slice : Expr::K::Index);
        ix->args.push_back(std::move(e));
        ix->args.push_back(lo ? std::move(lo) : nullptr);
        if (slice) {
          ix->args.push_back(hi ? std::move(hi) : nullptr);
          ix->args.push_back(step ? std::move(step) : nullptr);
        }
        e = std::move(ix);
      } else if (peek().k == Token::K::Op && peek().text == "(") {
        auto c = make(Expr::K::Call);
        c->args.push_back(std::move(e));
        callArgs(*c);
        e = std::move(c);
      } else if (acceptOp("|")) {
        auto f = make(Expr::K::Filter, expectName());
        f->args.push_back(std::move(e));
        if (peek().k == Token::K::Op && peek().text == "(") callArgs(*f);
        e = std::move(f);
      } else {
        return e;
      }
    }
  }
  ExprPtr primary() {
    const Token t = peek();
    ++pos_;
    auto lit = [&](Value v) {
      auto e = make(Expr::K::Literal);
      e->literal = std::move(v);
      return e;
    };
    switch (t.k) {
    case Token::K::Str: {
      std::string s = t.text;
      while (peek().k == Token::K::Str) s += toks_[pos_++].text; // adjacent literals join
      return lit(Value::str(s));
    }
    case Token::K::Int: return lit(Value::integer(t.i));
    case Token::K::Float: return lit(Value::real(t.f));
    case Token::K::Name:
      if (t.text == "true" || t.text == "True") return lit(Value::boolean(true));
      if (t.text == "false" || t.text == "False") return lit(Value::boolean(false));
      if (t.text == "none" || t.text == "None") return lit(Value::none());
      return make(Expr::K::Name, t.text);
    case Token::K::Op:
      if (t.text == "(") {
        ExprPtr e = parseExpression();
        if (acceptOp(",")) { // a tuple: a list here
          auto l = make(Expr::K::ListLit);
          l->args.push_back(std::move(e));
          while (!acceptOp(")")) {
            l->args.push_back(parseExpression());
            if (!acceptOp(",")) { expectOp(")"); break; }
          }
          return l;
        }
        expectOp(")");
        return e;
      }
      if (t.text == "[") {
        auto l = make(Expr::K::ListLit);
        while (!acceptOp("]")) {
          l->args.push_back(parseExpression());
          if (!acceptOp(",")) { expectOp("]"); break; }
        }
        return l;
      }
      if (t.text == "{") {
        auto d = make(Expr::K::DictLit);
        while (!acceptOp("}")) {
          d->args.push_back(parseExpression());
          expectOp(":");
          d->args.push_back(parseExpression());
          if (!acceptOp(",")) { expectOp("}"); break; }
        }
        return d;
      }
      break;
    case Token::K::End: break;
    }
    --pos_;
    fail("unexpected '" + t.text + "'");
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int line_;
  int depth_ = 0;
};

} // namespace

// ---- statements -----------------------------------------------------------

struct ChatTemplate::Node {
  enum class K { Text, Output, If, For, Set, Block } k;
  std::string text;                          // Text
  std::vector<ExprPtr> exprs;                // Output: 1; If: conditions; For: iterable, filter; Set: value
  std::vector<std::vector<std::unique_ptr<Node>>> bodies; // If: one per condition, + else; For: body, else
  std::vector<std::string> names;            // For: loop variables; Set: target (name, or name + attribute)
  int line = 0;
};

namespace {

using Node = ChatTemplate::Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Segment {
  enum class K { Text, Output, Statement } k;
  std::string text;
  int line;
};

// Splits the source into text, {{ }} and {% %} (comments dropped), with
// jinja2's whitespace rules as transformers configures them.
std::vector<Segment> segment(const std::string &src) {
  std::vector<Segment> out;
  std::string text;
  int line = 1;
  bool trimNextNewline = false, stripNextSpace = false;
  // jinja2's line_starting: the previous tag's match (with what it consumed) ended a line.
  bool lineStarting = true;
  size_t i = 0;
  auto flushText = [&] {
    if (!text.empty()) out.push_back({Segment::K::Text, text, line});
    text.clear();
  };
  while (i < src.size()) {
    size_t open = src.find('{', i);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#')
      open = src.find('{', open + 1);
    std::string chunk = src.substr(i, open == std::string::npos ? std::string::npos : open - i);
    if (stripNextSpace) {
      size_t k = chunk.find_first_not_of(" \t\r\n");
      std::string consumed = chunk.substr(0, k == std::string::npos ? chunk.size() : k);
      if (!consumed.empty()) lineStarting = consumed.back() == '\n';
      chunk = k == std::string::npos ? "" : chunk.substr(k);
    } else if (trimNextNewline && !chunk.empty() && chunk[0] == '\n') {
      chunk = chunk.substr(1);
      lineStarting = true;
    }
    trimNextNewline = stripNextSpace = false;
    text += chunk;
    for (char c : src.substr(i, open == std::string::npos ? std::string::npos : open - i)) line += c == '\n';
    if (open == std::string::npos || open + 1 >= src.size()) break;
    const char kind = src[open + 1];
    const char *closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t close = src.find(closer, open + 2);
    if (close == std::string::npos) throw Failure{"line " + std::to_string(line) + ": unclosed tag"};
    std::string inner = src.substr(open + 2, close - open - 2);
    const bool leftDash = !inner.empty() && inner[0] == '-', leftPlus = !inner.empty() && inner[0] == '+';
    // "{{-}}": one dash is the left one; the right needs a character of its own.
    const bool rightDash = inner.size() > size_t(leftDash || leftPlus) && inner.back() == '-';
    if (leftDash) {
      size_t k = text.find_last_not_of(" \t\r\n");
      text = k == std::string::npos ? "" : text.substr(0, k + 1);
    } else if (kind != '{' && !leftPlus) { // lstrip_blocks: spaces from the line start to a block tag
      size_t nl = text.find_last_of('\n');
      size_t start = nl == std::string::npos ? 0 : nl + 1;
      if ((nl != std::string::npos || lineStarting) && text.find_first_not_of(" \t", start) == std::string::npos)
        text.erase(start);
    }
    if (leftDash || leftPlus) inner.erase(0, 1);
    if (rightDash) inner.pop_back();
    flushText();
    if (kind != '#') out.push_back({kind == '{' ? Segment::K::Output : Segment::K::Statement, inner, line});
    for (char c : src.substr(open, close + 2 - open)) line += c == '\n';
    stripNextSpace = rightDash;
    trimNextNewline = kind != '{'; // trim_blocks: the newline after a block tag
    lineStarting = false;
    i = close + 2;
  }
  flushText();
  return out;
}

class StatementParser {
public:
  explicit StatementParser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  // Parses until one of `enders` (a statement keyword) or the end; returns which ended it.
  std::string parseBody(Body &body, const std::vector<std::string> &enders) {
    if (++depth_ > 100) throw Failure{"blocks nested more than 100 deep"};
    struct Leave {
      int &d;
      ~Leave() { --d; }
    } leave{depth_};
    while (pos_ < segs_.size()) {
      const Segment &s = segs_[pos_];
      if (s.k == Segment::K::Text) {
        auto n = node(Node::K::Text, s.line);
        n->text = s.text;
        body.push_back(std::move(n));
        ++pos_;
        continue;
      }
      ExprParser p(s.text, s.line);
      if (s.k == Segment::K::Output) {
        auto n = node(Node::K::Output, s.line);
        n->exprs.push_back(p.parseExpression());
        p.expectEnd();
        body.push_back(std::move(n));
        ++pos_;
        continue;
      }
      std::string keyword = p.expectName();
      for (const std::string &e : enders)
        if (keyword == e) return keyword;
      ++pos_;
      if (keyword == "if") {
        auto n = node(Node::K::If, s.line);
        n->exprs.push_back(p.parseExpression());
        p.expectEnd();
        for (;;) {
          n->bodies.emplace_back();
          std::string end = parseBody(n->bodies.back(), {"elif", "else", "endif"});
          if (end.empty()) throw Failure{"line " + std::to_string(s.line) + ": missing {% endif %}"};
          ExprParser q(segs_[pos_].text, segs_[pos_].line);
          q.expectName();
          ++pos_;
          if (end == "elif") {
            n->exprs.push_back(q.parseExpression());
            q.expectEnd();
          } else if (end == "else") {
            q.expectEnd();
            n->bodies.emplace_back();
            expectEnd(parseBody(n->bodies.back(), {"endif"}), "endif", s.line);
            break;
          } else {
            break;
          }
        }
        body.push_back(std::move(n));
      } else if (keyword == "for") {
        auto n = node(Node::K::For, s.line);
        n->names.push_back(p.expectName());
        while (p.acceptOp(",")) n->names.push_back(p.expectName());
        if (!p.acceptName("in")) p.fail("expected 'in' in a for loop");
        n->exprs.push_back(p.parseOr());
        if (p.acceptName("if")) n->exprs.push_back(p.parseExpression());
        if (p.acceptName("recursive")) p.fail("recursive loops are not supported");
        p.expectEnd();
        n->bodies.emplace_back();
        std::string end = parseBody(n->bodies.back(), {"else", "endfor"});
        if (end.empty()) throw Failure{"line " + std::to_string(s.line) + ": missing {% endfor %}"};
        ++pos_;
        if (end == "else") {
          n->bodies.emplace_back();
          expectEnd(parseBody(n->bodies.back(), {"endfor"}), "endfor", s.line);
        }
        body.push_back(std::move(n));
      } else if (keyword == "set") {
        auto n = node(Node::K::Set, s.line);
        n->names.push_back(p.expectName());
        if (p.acceptOp(".")) n->names.push_back(p.expectName());
        if (!p.acceptOp("=")) p.fail("block {% set %} ... {% endset %} is not supported");
        n->exprs.push_back(p.parseExpression());
        p.expectEnd();
        body.push_back(std::move(n));
      } else if (keyword == "generation") { // transformers' assistant-mask marker: its body renders as is
        p.expectEnd();
        auto n = node(Node::K::Block, s.line);
        n->bodies.emplace_back();
        expectEnd(parseBody(n->bodies.back(), {"endgeneration"}), "endgeneration", s.line);
        body.push_back(std::move(n));
      } else {
        p.fail("'{% " + keyword + " %}' is not supported");
      }
    }
    return "";
  }

private:
  static std::unique_ptr<Node> node(Node::K k, int line) {
    auto n = std::make_unique<Node>();
    n->k = k;
    n->line = line;
    return n;
  }
  void expectEnd(const std::string &got, const char *want, int line) {
    if (got != want) throw Failure{"line " + std::to_string(line) + ": missing {% " + want + " %}"};
    ++pos_;
  }

  std::vector<Segment> segs_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// ---- evaluation -----------------------------------------------------------

class Renderer {
public:
  std::vector<std::map<std::string, Value>> scopes;

  Value lookup(const std::string &name) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value{};
  }

  void render(const Body &body, std::string &out) {
    for (const auto &n : body) {
      switch (n->k) {
      case Node::K::Text: out += n->text; break;
      case Node::K::Output: out += toText(eval(*n->exprs[0])); break;
      case Node::K::Block: render(n->bodies[0], out); break;
      case Node::K::If: {
        size_t taken = n->exprs.size();
        for (size_t c = 0; c < n->exprs.size(); ++c)
          if (eval(*n->exprs[c]).truthy()) {
            taken = c;
            break;
          }
        if (taken < n->bodies.size()) render(n->bodies[taken], out);
        break;
      }
      case Node::K::Set: {
        Value v = eval(*n->exprs[0]);
        if (n->names.size() == 1) {
          scopes.back()[n->names[0]] = v;
        } else {
          Value target = lookup(n->names[0]);
          if (target.t != Value::T::Dict) fail(n->line, "cannot set an attribute of '" + n->names[0] + "'");
          bool found = false;
          for (auto &[k, old] : *target.d)
            if (k == n->names[1]) old = v, found = true;
          if (!found) target.d->emplace_back(n->names[1], v);
        }
        break;
      }
      case Node::K::For: renderFor(*n, out); break;
      }
    }
  }

private:
  [[noreturn]] static void fail(int line, const std::string &what) {
    throw Failure{"line " + std::to_string(line) + ": " + what};
  }
  [[noreturn]] static void fail(const std::string &what) { throw Failure{what}; }

  void renderFor(const Node &n, std::string &out) {
    Value seq = eval(*n.exprs[0]);
    List items;
    if (seq.t == Value::T::List) items = *seq.l;
    else if (seq.t == Value::T::Dict) for (const auto &kv : *seq.d) items.push_back(Value::str(kv.first));
    else if (seq.t == Value::T::Str) for (char c : seq.s) items.push_back(Value::str(std::string(1, c)));
    else if (seq.t != Value::T::Undefined && seq.t != Value::T::None) fail(n.line, "cannot loop over " + repr(seq));
    // The if filter runs before loop.* counts, as in jinja.
    List kept;
    for (const Value &item : items) {
      if (n.exprs.size() > 1) {
        scopes.emplace_back();
        bind(n, item);
        bool keep = eval(*n.exprs[1]).truthy();
        scopes.pop_back();
        if (!keep) continue;
      }
      kept.push_back(item);
    }
    if (kept.empty()) {
      if (n.bodies.size() > 1) render(n.bodies[1], out);
      return;
    }
    for (size_t k = 0; k < kept.size(); ++k) {
      scopes.emplace_back();
      bind(n, kept[k]);
      const int64_t len = int64_t(kept.size()), idx = int64_t(k);
      scopes.back()["loop"] = Value::dict(
          {{"index", Value::integer(idx + 1)}, {"index0", Value::integer(idx)}, {"first", Value::boolean(idx == 0)},
           {"last", Value::boolean(idx == len - 1)}, {"length", Value::integer(len)},
           {"revindex", Value::integer(len - idx)}, {"revindex0", Value::integer(len - idx - 1)},
           {"previtem", idx ? kept[k - 1] : Value{}}, {"nextitem", idx + 1 < len ? kept[k + 1] : Value{}}});
      render(n.bodies[0], out);
      scopes.pop_back();
    }
  }

  void bind(const Node &n, const Value &item) {
    if (n.names.size() == 1) {
      scopes.back()[n.names[0]] = item;
      return;
    }
    if (item.t != Value::T::List || item.l->size() != n.names.size()) fail(n.line, "cannot unpack " + repr(item));
    for (size_t k = 0; k < n.names.size(); ++k) scopes.back()[n.names[k]] = (*item.l)[k];
  }

  static int64_t index(int64_t i, int64_t size) { return i < 0 ? i + size : i; }

  Value attr(const Value &obj, const std::string &name) {
    if (const Value *v = obj.find(name)) return *v;
    return Value{};
  }

  Value item(const Value &obj, const Value &key) {
    if (obj.t == Value::T::Dict) {
      if (key.t != Value::T::Str) return Value{};
      return attr(obj, key.s);
    }
    if ((obj.t == Value::T::List || obj.t == Value::T::Str) && key.t == Value::T::Int) {
      int64_t size = obj.t == Value::T::List ? int64_t(obj.l->size()) : int64_t(obj.s.size());
      int64_t i = index(key.i, size);
      if (i < 0 || i >= size) return Value{};
      return obj.t == Value::T::List ? (*obj.l)[size_t(i)] : Value::str(obj.s.substr(size_t(i), 1));
    }
    return Value{};
  }

  Value slice(const Value &obj, const Expr *lo, const Expr *hi, const Expr *st) {
    int64_t size = obj.t == Value::T::List ? int64_t(obj.l->size()) : obj.t == Value::T::Str ? int64_t(obj.s.size()) : -1;
    if (size < 0) fail("cannot slice " + repr(obj));
    int64_t step = st ? eval(*st).i : 1;
    if (step == 0) fail("slice step cannot be zero");
    auto bound = [&](const Expr *e, int64_t def) {
      if (!e) return def;
      int64_t v = index(eval(*e).i, size);
      return step > 0 ? std::clamp<int64_t>(v, 0, size) : std::clamp<int64_t>(v, -1, size - 1);
    };
    int64_t a = bound(lo, step > 0 ? 0 : size - 1), b = bound(hi, step > 0 ? size : -1);
    List l;
    std::string s;
    for (int64_t k = a; step > 0 ? k < b : k > b; k += step) {
      if (obj.t == Value::T::List) l.push_back((*obj.l)[size_t(k)]);
      else s += obj.s[size_t(k)];
    }
    return obj.t == Value::T::List ? Value::list(std::move(l)) : Value::str(s);
  }

  Value method(const Value &obj, const std::string &name, const std::vector<Value> &args) {
    auto arg = [&](size_t k) -> const Value & {
      static const Value undefined;
      return k < args.size() ? args[k] : undefined;
    };
    if (obj.t == Value::T::Str) {
      const std::string &s = obj.s;
      auto chars = [&](size_t k) { return arg(k).t == Value::T::Str ? arg(k).s : std::string(" \t\n\r\f\v"); };
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        std::string set = chars(0);
        size_t b = name == "rstrip" ? 0 : s.find_first_not_of(set);
        if (b == std::string::npos) return Value::str("");
        size_t e = name == "lstrip" ? s.size() : s.find_last_not_of(set) + 1;
        return Value::str(s.substr(b, e - b));
      }
      if (name == "startswith") return Value::boolean(s.rfind(arg(0).s, 0) == 0);
      if (name == "endswith")
        return Value::boolean(s.size() >= arg(0).s.size() && s.compare(s.size() - arg(0).s.size(), arg(0).s.size(), arg(0).s) == 0);
      if (name == "lower" || name == "upper") {
        std::string r = s;
        for (char &c : r) c = char(name == "lower" ? std::tolower(uint8_t(c)) : std::toupper(uint8_t(c)));
        return Value::str(r);
      }
      if (name == "replace") {
        std::string r, from = arg(0).s, to = arg(1).s;
        if (from.empty()) return obj;
        for (size_t k = 0;;) {
          size_t at = s.find(from, k);
          if (at == std::string::npos) { r += s.substr(k); break; }
          r += s.substr(k, at - k) + to;
          k = at + from.size();
        }
        return Value::str(r);
      }
      if (name == "split") {
        List parts;
        if (arg(0).t == Value::T::Str) {
          for (size_t k = 0;;) {
            size_t at = s.find(arg(0).s, k);
            parts.push_back(Value::str(s.substr(k, at == std::string::npos ? std::string::npos : at - k)));
            if (at == std::string::npos) break;
            k = at + arg(0).s.size();
          }
        } else {
          size_t k = 0;
          while ((k = s.find_first_not_of(" \t\n\r\f\v", k)) != std::string::npos) {
            size_t e = s.find_first_of(" \t\n\r\f\v", k);
            parts.push_back(Value::str(s.substr(k, e == std::string::npos ? std::string::npos : e - k)));
            k = e;
          }
        }
        return Value::list(std::move(parts));
      }
    }
    if (obj.t == Value::T::Dict) {
      if (name == "get") {
        const Value *v = arg(0).t == Value::T::Str ? obj.find(arg(0).s) : nullptr;
        return v ? *v : args.size() > 1 ? args[1] : Value::none();
      }
      if (name == "items" || name == "keys" || name == "values") {
        List l;
        for (const auto &[k, v] : *obj.d)
          l.push_back(name == "keys" ? Value::str(k) : name == "values" ? v : Value::list({Value::str(k), v}));
        return Value::list(std::move(l));
      }
    }
    fail("no method '" + name + "' on " + repr(obj));
  }

  Value filter(const std::string &name, const Value &v, const std::vector<Value> &args) {
    auto size = [&]() -> int64_t {
      if (v.t == Value::T::List) return int64_t(v.l->size());
      if (v.t == Value::T::Dict) return int64_t(v.d->size());
      if (v.t == Value::T::Str) { // characters, not bytes
        int64_t n = 0;
        for (unsigned char c : v.s) n += (c & 0xC0) != 0x80;
        return n;
      }
      return 0;
    };
    if (name == "trim") return method(Value::str(toText(v)), "strip", {});
    if (name == "length" || name == "count") return Value::integer(size());
    if (name == "upper" || name == "lower") return method(Value::str(toText(v)), name, {});
    if (name == "string") return Value::str(toText(v));
    if (name == "tojson") return Value::str(toJson(v));
    if (name == "default" || name == "d") return v.t == Value::T::Undefined ? (args.empty() ? Value::str("") : args[0]) : v;
    if (name == "first" || name == "last") {
      if (v.t == Value::T::List) return v.l->empty() ? Value{} : name == "first" ? v.l->front() : v.l->back();
      if (v.t == Value::T::Str) return v.s.empty() ? Value{} : Value::str(name == "first" ? v.s.substr(0, 1) : v.s.substr(v.s.size() - 1));
    }
    if (name == "join" && v.t == Value::T::List) {
      std::string r, sep = args.empty() ? "" : toText(args[0]);
      for (size_t k = 0; k < v.l->size(); ++k) r += (k ? sep : "") + toText((*v.l)[k]);
      return Value::str(r);
    }
    if (name == "list") return v.t == Value::T::List ? v : Value::list();
    if (name == "reverse" && v.t == Value::T::List) return Value::list(List(v.l->rbegin(), v.l->rend()));
    if (name == "capitalize") {
      std::string r = toText(v);
      for (size_t k = 0; k < r.size(); ++k) r[k] = char(k ? std::tolower(uint8_t(r[k])) : std::toupper(uint8_t(r[k])));
      return Value::str(r);
    }
    if (name == "int") {
      if (!isNumber(v)) return Value::integer(std::strtoll(toText(v).c_str(), nullptr, 10));
      if (v.t != Value::T::Float) return Value::integer(intOf(v));
      // Only floats inside int64's range convert (NaN and infinities do not).
      if (!(v.f > -9.2233720368547758e18 && v.f < 9.2233720368547758e18)) fail("int: " + repr(v) + " is out of range");
      return Value::integer(int64_t(v.f));
    }
    fail("filter '" + name + "' is not supported");
  }

  bool test(const std::string &name, const Value &v, const std::vector<Value> &args) {
    if (name == "defined") return v.t != Value::T::Undefined;
    if (name == "undefined") return v.t == Value::T::Undefined;
    if (name == "none") return v.t == Value::T::None;
    if (name == "string") return v.t == Value::T::Str;
    if (name == "number") return v.t == Value::T::Int || v.t == Value::T::Float;
    if (name == "integer") return v.t == Value::T::Int;
    if (name == "boolean") return v.t == Value::T::Bool;
    if (name == "true") return v.t == Value::T::Bool && v.b;
    if (name == "false") return v.t == Value::T::Bool && !v.b;
    if (name == "mapping") return v.t == Value::T::Dict;
    if (name == "sequence" || name == "iterable") return v.t == Value::T::List || v.t == Value::T::Str || v.t == Value::T::Dict;
    if (name == "odd" || name == "even") return v.t == Value::T::Int && (v.i % 2 != 0) == (name == "odd");
    if (name == "divisibleby") return v.t == Value::T::Int && !args.empty() && args[0].i && v.i % args[0].i == 0;
    if (name == "equalto" || name == "eq") return !args.empty() && equal(v, args[0]);
    fail("test '" + name + "' is not supported");
  }

  Value call(const Expr &e) {
    std::vector<Value> args;
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    const Expr &callee = *e.args[0];
    if (callee.k == Expr::K::Attr) return method(eval(*callee.args[0]), callee.name, args);
    if (callee.k == Expr::K::Name) {
      if (callee.name == "raise_exception") fail("the template raised: " + (args.empty() ? "" : toText(args[0])));
      if (callee.name == "namespace") {
        Dict d;
        for (const auto &[k, v] : e.kwargs) d.emplace_back(k, eval(*v));
        return Value::dict(std::move(d));
      }
      if (callee.name == "range") {
        int64_t a = args.size() > 1 ? args[0].i : 0, b = args.size() > 1 ? args[1].i : args.empty() ? 0 : args[0].i;
        if (b - a > 100000) fail("range() of more than 100000 numbers");
        List l;
        for (int64_t k = a; k < b; ++k) l.push_back(Value::integer(k));
        return Value::list(std::move(l));
      }
      if (callee.name == "strftime_now") {
        char buf[128];
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        std::strftime(buf, sizeof buf, args.empty() ? "" : args[0].s.c_str(), &tm);
        return Value::str(buf);
      }
    }
    fail("unknown function in a call");
  }

  Value arith(const std::string &op, const Value &a, const Value &b) {
    if (op == "+" && a.t == Value::T::Str && b.t == Value::T::Str) return Value::str(a.s + b.s);
    if (op == "+" && a.t == Value::T::List && b.t == Value::T::List) {
      List l = *a.l;
      l.insert(l.end(), b.l->begin(), b.l->end());
      return Value::list(std::move(l));
    }
    if (!isNumber(a) || !isNumber(b)) fail("cannot apply '" + op + "' to " + repr(a) + " and " + repr(b));
    const bool ints = a.t != Value::T::Float && b.t != Value::T::Float;
    double x = numberOf(a), y = numberOf(b);
    if (op == "/") return Value::real(x / y);
    if (ints) { // exact in int64, as far as it reaches (Python's ints are unbounded: past that, an error)
      const int64_t p = intOf(a), q = intOf(b);
      if ((op == "//" || op == "%") && q == 0) fail("division by zero");
      int64_t r = 0;
      bool overflow = op == "+"   ? __builtin_add_overflow(p, q, &r)
                      : op == "-" ? __builtin_sub_overflow(p, q, &r)
                      : op == "*" ? __builtin_mul_overflow(p, q, &r)
                                  : (p == INT64_MIN && q == -1);
      if (overflow) fail("integer overflow in '" + op + "'");
      if (op == "+" || op == "-" || op == "*") return Value::integer(r);
      int64_t div = p / q - ((p % q != 0) && ((p < 0) != (q < 0)));
      return Value::integer(op == "//" ? div : p - div * q);
    }
    if (op == "+") return Value::real(x + y);
    if (op == "-") return Value::real(x - y);
    if (op == "*") return Value::real(x * y);
    if (op == "//") return Value::real(std::floor(x / y));
    return Value::real(x - std::floor(x / y) * y);
  }

  bool contains(const Value &hay, const Value &needle) {
    if (hay.t == Value::T::Str) return needle.t == Value::T::Str && hay.s.find(needle.s) != std::string::npos;
    if (hay.t == Value::T::List) {
      for (const Value &v : *hay.l)
        if (equal(v, needle)) return true;
      return false;
    }
    if (hay.t == Value::T::Dict) return needle.t == Value::T::Str && hay.find(needle.s);
    fail("'in' needs a string, list or dict, got " + repr(hay));
  }

  Value eval(const Expr &e) {
    switch (e.k) {
    case Expr::K::Literal: return e.literal;
    case Expr::K::Name: return lookup(e.name);
    case Expr::K::Attr: return attr(eval(*e.args[0]), e.name);
    case Expr::K::Index: return item(eval(*e.args[0]), eval(*e.args[1]));
    case Expr::K::Slice: return slice(eval(*e.args[0]), e.args[1].get(), e.args[2].get(), e.args[3].get());
    case Expr::K::Call: return call(e);
    case Expr::K::Filter: {
      std::vector<Value> args;
      for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
      return filter(e.name, eval(*e.args[0]), args);
    }
    case Expr::K::Test: {
      std::vector<Value> args;
      for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
      return Value::boolean(test(e.name, eval(*e.args[0]), args) != e.negated);
    }
    case Expr::K::Unary: {
      Value v = eval(*e.args[0]);
      if (e.name == "not") return Value::boolean(!v.truthy());
      if (v.t == Value::T::Int) {
        if (v.i == INT64_MIN) fail("integer overflow in '-'");
        return Value::integer(-v.i);
      }
      if (v.t == Value::T::Float) return Value::real(-v.f);
      fail("cannot negate " + repr(v));
    }
    case Expr::K::Cond: return eval(*e.args[0]).truthy() ? eval(*e.args[1]) : eval(*e.args[2]);
    case Expr::K::ListLit: {
      List l;
      for (const auto &a : e.args) l.push_back(eval(*a));
      return Value::list(std::move(l));
    }
    case Expr::K::DictLit: {
      Dict d;
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) d.emplace_back(toText(eval(*e.args[k])), eval(*e.args[k + 1]));
      return Value::dict(std::move(d));
    }
    case Expr::K::Binary: {
      const std::string &op = e.name;
      if (op == "and") {
        Value a = eval(*e.args[0]);
        return a.truthy() ? eval(*e.args[1]) : a;
      }
      if (op == "or") {
        Value a = eval(*e.args[0]);
        return a.truthy() ? a : eval(*e.args[1]);
      }
      Value a = eval(*e.args[0]), b = eval(*e.args[1]);
      if (op == "~") return Value::str(toText(a) + toText(b));
      if (op == "==") return Value::boolean(equal(a, b));
      if (op == "!=") return Value::boolean(!equal(a, b));
      if (op == "in") return Value::boolean(contains(b, a));
      if (op == "not in") return Value::boolean(!contains(b, a));
      if (op == "<" || op == ">" || op == "<=" || op == ">=") {
        int c;
        if (isNumber(a) && isNumber(b)) c = numberOf(a) < numberOf(b) ? -1 : numberOf(a) > numberOf(b) ? 1 : 0;
        else if (a.t == Value::T::Str && b.t == Value::T::Str) c = a.s.compare(b.s);
        else fail("cannot compare " + repr(a) + " and " + repr(b));
        return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
      }
      return arith(op, a, b);
    }
    }
    return Value{};
  }
};

} // namespace

namespace {

// An assistant turn's "tool_calls" as templates read them: each call's
// arguments an object (the API sends a JSON string; chat datasets an object).
Status readToolCalls(const Json &v, const std::string &field, Json &out) {
  if (v.type != Json::Type::Array) return sdError(field, " must be a list of tool calls");
  out = Json();
  out.type = Json::Type::Array;
  for (size_t k = 0; k < v.arr.size(); ++k) {
    const std::string at = field + "[" + std::to_string(k) + "]";
    const Json &c = v.arr[k];
    const Json *f = c.get("function");
    const Json *name = f ? f->get("name") : nullptr, *args = f ? f->get("arguments") : nullptr;
    if (c.type != Json::Type::Object || !name || name->type != Json::Type::String)
      return sdError(at, " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
    Json arguments;
    if (args && args->type == Json::Type::String) {
      auto parsed = parseJson(args->str, "the arguments");
      if (!parsed.isOk()) return sdError(at, ".function.arguments is not JSON: ", parsed.status().message());
      arguments = std::move(parsed.value());
    } else if (args && args->type == Json::Type::Object) {
      arguments = *args;
    } else {
      return sdError(at, ".function.arguments must be a JSON object (or its text)");
    }
    Json call = c;
    for (auto &[key, value] : call.obj)
      if (key == "function")
        for (auto &[fk, fv] : value.obj)
          if (fk == "arguments") fv = arguments;
    out.arr.push_back(std::move(call));
  }
  return Status::ok();
}

} // namespace

Status chatMessagesFromJson(const Json &messages, std::vector<ChatMessage> &out) {
  if (messages.type != Json::Type::Array || messages.arr.empty())
    return sdError("'messages' must be a non-empty list of {\"role\", \"content\"}");
  for (size_t k = 0; k < messages.arr.size(); ++k) {
    const Json &m = messages.arr[k];
    const std::string field = "messages[" + std::to_string(k) + "]";
    const Json *role = m.get("role");
    if (m.type != Json::Type::Object || !role || role->type != Json::Type::String)
      return sdError(field, " needs a string 'role'");
    ChatMessage msg;
    msg.fields.type = Json::Type::Object;
    msg.role = role->str == "developer" ? "system" : role->str; // OpenAI's newer name for the system role
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      return sdError(field, " has the unknown role '", role->str.substr(0, 40), "' (system, user, assistant, tool)");
    bool calls = false;
    for (const auto &[key, value] : m.obj) {
      if (key == "role" || key == "content" || value.type == Json::Type::Null) continue;
      if (key == "tool_calls" && msg.role == "assistant") {
        Json read;
        SD_RETURN_IF_ERROR(readToolCalls(value, field + ".tool_calls", read));
        calls = !read.arr.empty();
        if (calls) msg.fields.obj.emplace_back("tool_calls", std::move(read));
      } else if ((key == "tool_call_id" && msg.role == "tool") || key == "name") {
        if (value.type != Json::Type::String) return sdError(field, ".", key, " must be a string");
        msg.fields.obj.emplace_back(key, value);
      } else {
        return sdError(field, ".", key.substr(0, 40), " is not supported for a ", msg.role, " message");
      }
    }
    const Json *content = m.get("content");
    if (!content || content->type == Json::Type::Null) {
      if (!calls) return sdError(field, " needs 'content' (it may be null only beside tool_calls)");
      msg.noContent = true;
    } else if (content->type == Json::Type::String) {
      msg.content = content->str;
    } else if (content->type == Json::Type::Array) { // text parts, joined by newlines as vLLM joins them
      for (size_t i = 0; i < content->arr.size(); ++i) {
        const Json &part = content->arr[i];
        const Json *type = part.get("type"), *text = part.get("text");
        if (!type || type->type != Json::Type::String || type->str != "text" || !text || text->type != Json::Type::String)
          return sdError(field, ".content[", i, "] must be a text part {\"type\": \"text\", \"text\": ...} (the model "
                         "reads text only)");
        msg.content += (i ? "\n" : "") + text->str;
      }
    } else {
      return sdError(field, ".content must be a string or a list of text parts");
    }
    out.push_back(std::move(msg));
  }
  return Status::ok();
}

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;

StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::parse(const std::string &source) {
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  try {
    StatementParser p(segment(source));
    std::string stray = p.parseBody(t->body_, {"endif", "endfor", "elif", "else", "endgeneration"});
    if (!stray.empty()) return sdError("chat template: {% ", stray, " %} without its opening statement");
  } catch (const Failure &f) {
    return sdError("chat template: ", f.message);
  }
  return t;
}

namespace {

// A JSON value as Python's json.loads gives it to the template.
Value fromJson(const Json &j) {
  switch (j.type) {
  case Json::Type::Null: return Value::none();
  case Json::Type::Bool: return Value::boolean(j.b);
  case Json::Type::Number: return j.isInteger() ? Value::integer(int64_t(j.num)) : Value::real(j.num);
  case Json::Type::String: return Value::str(j.str);
  case Json::Type::Array: {
    List l;
    for (const Json &e : j.arr) l.push_back(fromJson(e));
    return Value::list(std::move(l));
  }
  case Json::Type::Object: {
    Dict d;
    for (const auto &[k, v] : j.obj) d.emplace_back(k, fromJson(v));
    return Value::dict(std::move(d));
  }
  }
  return Value::none();
}

} // namespace

StatusOr<std::string> ChatTemplate::render(const std::vector<ChatMessage> &messages, bool addGenerationPrompt,
                                           const std::map<std::string, std::string> &strings, const Json *tools) const {
  Renderer r;
  r.scopes.emplace_back();
  List list;
  for (const ChatMessage &m : messages) {
    Dict d = {{"role", Value::str(m.role)}, {"content", m.noContent ? Value::none() : Value::str(m.content)}};
    if (m.fields.type == Json::Type::Object)
      for (const auto &[k, v] : m.fields.obj) d.emplace_back(k, fromJson(v));
    list.push_back(Value::dict(std::move(d)));
  }
  r.scopes.back()["messages"] = Value::list(std::move(list));
  if (tools) r.scopes.back()["tools"] = fromJson(*tools);
  r.scopes.back()["add_generation_prompt"] = Value::boolean(addGenerationPrompt);
  for (const auto &[k, v] : strings) r.scopes.back()[k] = Value::str(v);
  r.scopes.emplace_back(); // the template's own top-level {% set %}s
  std::string out;
  try {
    r.render(body_, out);
  } catch (const Failure &f) {
    return sdError("chat template: ", f.message);
  }
  return out;
}

} // namespace sd
