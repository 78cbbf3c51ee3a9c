// JSON Schema -> the JSON grammar of structured output. Keywords that
// constrain what we cannot yet generate are errors naming them, so a schema is
// never followed in part.
#include "sd/format/json.h"
#include "sd/generate/json_grammar.h"
#include "sd/generate/pattern.h"
#include <cmath>
#include <map>
#include <set>

namespace sd::generate {
namespace {

using Node = JsonGrammar::Node;
using Kind = Node::Kind;

// Keywords that describe and do not constrain, and where definitions live.
const std::set<std::string> kIgnored = {"title",   "description", "default", "examples", "$schema", "$id",
                                        "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",  "definitions"};
// Keywords that constrain, and that the grammar follows.
const std::set<std::string> kFollowed = {"type",      "properties", "required",  "additionalProperties",
                                         "items",     "minItems",   "maxItems",  "minLength",
                                         "maxLength", "enum",       "const",     "anyOf",
                                         "oneOf",     "allOf",      "$ref",      "pattern",
                                         "format",    "minimum",    "maximum",   "exclusiveMinimum",
                                         "exclusiveMaximum"};

// A regular expression for the decimal integers in [lo, hi] (no leading
// zeros): the range cut where digits roll over (lo's tail filled with 9s,
// hi's with 0s), each piece a run of fixed digits and one digit range.
std::string digitPieces(uint64_t lo, uint64_t hi) {
  if (lo > hi) return "";
  std::set<uint64_t> stops = {hi};
  auto nines = [](uint64_t n, int k) {
    uint64_t p = 1;
    for (int i = 0; i < k; ++i) p *= 10;
    return n - n % p + (p - 1);
  };
  auto zeros = [](uint64_t n, int k) {
    uint64_t p = 1;
    for (int i = 0; i < k; ++i) p *= 10;
    return n - n % p;
  };
  for (int k = 1; k < 19 && nines(lo, k) < hi; ++k)
    if (nines(lo, k) >= lo) stops.insert(nines(lo, k));
  for (int k = 1; k < 19; ++k) {
    const uint64_t z = zeros(hi + 1, k);
    if (z == 0 || z - 1 <= lo) break;
    if (z - 1 <= hi) stops.insert(z - 1);
  }
  std::string out;
  uint64_t start = lo;
  for (uint64_t stop : stops) {
    const std::string a = std::to_string(start), b = std::to_string(stop);
    std::string piece;
    for (size_t i = 0; i < a.size() && a.size() == b.size(); ++i)
      piece += a[i] == b[i] ? std::string(1, a[i]) : std::string("[") + a[i] + "-" + b[i] + "]";
    out += (out.empty() ? "" : "|") + piece;
    start = stop + 1;
  }
  return out;
}

// The non-negative integers from lo on (with more digits than lo's, any).
std::string digitsFrom(uint64_t lo) {
  const std::string digits = std::to_string(lo);
  uint64_t top = 1;
  for (size_t i = 0; i < digits.size(); ++i) top *= 10;
  return digitPieces(lo, top - 1) + "|[1-9][0-9]{" + std::to_string(digits.size()) + ",}";
}

// An integer range as a pattern over the number's text; lo/hi absent: unbounded.
std::string integerRange(bool hasLo, int64_t lo, bool hasHi, int64_t hi) {
  std::vector<std::string> parts;
  if (!hasLo || lo < 0) { // the negatives: -(|hi'| .. |lo|)
    const uint64_t nearest = hasHi && hi < 0 ? uint64_t(-hi) : 1;
    parts.push_back("-(" + (hasLo ? digitPieces(nearest, uint64_t(-lo)) : digitsFrom(nearest)) + ")");
  }
  if (!hasHi || hi >= 0) {
    const uint64_t from = hasLo && lo > 0 ? uint64_t(lo) : 0;
    parts.push_back(hasHi ? digitPieces(from, uint64_t(hi)) : digitsFrom(from));
  }
  std::string out;
  for (const std::string &p : parts) out += (out.empty() ? "" : "|") + p;
  return "^(" + out + ")$";
}

// The string formats followed, as patterns (email: the common form, not all
// of RFC 5321; date-time: RFC 3339's).
const std::map<std::string, std::string> kFormats = {
    {"date", "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"},
    {"time", "^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"date-time", "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                  "(\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"email", "^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\\.[a-zA-Z0-9-]+)*\\.[a-zA-Z]{2,}$"},
    {"ipv4", "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"}};

class SchemaReader {
public:
  SchemaReader(JsonGrammar &g, const Json &root) : g_(g), root_(root) {}

  StatusOr<int32_t> read(const Json &s, const std::string &path, int depth) {
    const std::string where = path.empty() ? "/" : path;
    if (depth > 64) return sdError("the JSON schema nests deeper than 64 levels at ", where);
    if (s.type == Json::Type::Bool) {
      if (!s.b) return sdError("the JSON schema at ", where, " is false: it allows no value");
      return any();
    }
    if (s.type != Json::Type::Object) return sdError("the JSON schema at ", where, " must be an object or a boolean");
    size_t constraints = 0;
    for (const auto &[key, value] : s.obj) {
      if (kIgnored.count(key)) continue;
      if (!kFollowed.count(key))
        return sdError("JSON schema keyword '", key.substr(0, 64), "' at ", where,
                       " is not supported (supported: type, properties, required, additionalProperties, items, "
                       "minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf, allOf, $ref)");
      ++constraints;
    }
    if (const Json *ref = s.get("$ref")) {
      if (constraints > 1) return sdError("the JSON schema at ", where, " has keywords beside $ref; only annotations may be");
      return readRef(*ref, where, depth);
    }
    for (const char *k : {"anyOf", "oneOf", "allOf"})
      if (const Json *list = s.get(k)) {
        if (constraints > 1) return sdError("the JSON schema at ", where, " has keywords beside ", k, "; only annotations may be");
        if (list->type != Json::Type::Array || list->arr.empty())
          return sdError(k, " at ", where, " must be a non-empty list of schemas");
        if (std::string(k) == "allOf") {
          if (list->arr.size() != 1) return sdError("allOf at ", where, " with more than one schema is not supported");
          return read(list->arr[0], path + "/allOf/0", depth + 1);
        }
        Node u;
        for (size_t i = 0; i < list->arr.size(); ++i) {
          auto alt = read(list->arr[i], path + "/" + k + "/" + std::to_string(i), depth + 1);
          if (!alt.isOk()) return alt.status();
          u.alternatives.push_back(alt.value());
        }
        return g_.add(std::move(u));
      }
    if (const Json *values = s.get("enum")) {
      if (values->type != Json::Type::Array || values->arr.empty())
        return sdError("enum at ", where, " must be a non-empty list");
      Node lit;
      lit.kind = Kind::Literal;
      for (const Json &v : values->arr) lit.literals.push_back(jsonCompact(v));
      return g_.add(std::move(lit));
    }
    if (const Json *value = s.get("const")) {
      Node lit;
      lit.kind = Kind::Literal;
      lit.literals.push_back(jsonCompact(*value));
      return g_.add(std::move(lit));
    }
    const Json *type = s.get("type");
    if (!type) { // no type: what the keywords imply, else any value
      if (s.get("properties") || s.get("required") || s.get("additionalProperties")) return readTyped(s, "object", where, path, depth);
      if (s.get("items") || s.get("minItems") || s.get("maxItems")) return readTyped(s, "array", where, path, depth);
      if (s.get("minLength") || s.get("maxLength") || s.get("pattern") || s.get("format"))
        return readTyped(s, "string", where, path, depth);
      return any();
    }
    if (type->type == Json::Type::String) return readTyped(s, type->str, where, path, depth);
    if (type->type != Json::Type::Array || type->arr.empty())
      return sdError("type at ", where, " must be a type name or a non-empty list of them");
    Node u;
    for (const Json &t : type->arr) {
      if (t.type != Json::Type::String) return sdError("type at ", where, " must list type names");
      auto alt = readTyped(s, t.str, where, path, depth);
      if (!alt.isOk()) return alt.status();
      u.alternatives.push_back(alt.value());
    }
    return g_.add(std::move(u));
  }

private:
  int32_t any() {
    if (any_ < 0) any_ = g_.addAnyValue();
    return any_;
  }

  // A count keyword: a non-negative integer (`out` untouched when absent).
  Status count(const Json &s, const char *key, const std::string &where, int64_t &out) {
    const Json *v = s.get(key);
    if (!v) return Status::ok();
    if (v->type != Json::Type::Number || !v->isInteger() || v->num < 0 || v->num > 1e9)
      return sdError(key, " at ", where, " must be a non-negative integer");
    out = int64_t(v->num);
    return Status::ok();
  }

  StatusOr<int32_t> readRef(const Json &ref, const std::string &where, int depth) {
    if (ref.type != Json::Type::String) return sdError("$ref at ", where, " must be a string");
    auto known = refs_.find(ref.str);
    if (known != refs_.end()) return known->second;
    const Json *target = nullptr;
    if (ref.str == "#") target = &root_;
    for (const char *dir : {"#/$defs/", "#/definitions/"}) {
      const std::string prefix = dir;
      if (ref.str.compare(0, prefix.size(), prefix) != 0) continue;
      std::string name = ref.str.substr(prefix.size());
      for (size_t at; (at = name.find("~1")) != std::string::npos;) name.replace(at, 2, "/");
      for (size_t at; (at = name.find("~0")) != std::string::npos;) name.replace(at, 2, "~");
      const Json *defs = root_.get(prefix.substr(2, prefix.size() - 3));
      if (defs) target = defs->get(name);
    }
    if (!target)
      return sdError("$ref '", ref.str.substr(0, 100), "' at ", where,
                     " names no schema (supported: #, #/$defs/NAME, #/definitions/NAME)");
    // A node stands for the reference before it is read, so a schema may refer to itself.
    Node u;
    const int32_t id = g_.add(std::move(u));
    refs_[ref.str] = id;
    auto body = read(*target, ref.str.substr(1), depth + 1);
    if (!body.isOk()) return body.status();
    g_.at(id).alternatives = {body.value()};
    return id;
  }

  StatusOr<int32_t> readTyped(const Json &s, const std::string &type, const std::string &where, const std::string &path,
                              int depth) {
    Node n;
    if (type == "string") {
      n.kind = Kind::String;
      SD_RETURN_IF_ERROR(count(s, "minLength", where, n.minCount));
      SD_RETURN_IF_ERROR(count(s, "maxLength", where, n.maxCount));
      const Json *pattern = s.get("pattern"), *format = s.get("format");
      if (pattern && format) return sdError("pattern and format together at ", where, " are not supported");
      if (format) {
        auto known = format->type == Json::Type::String ? kFormats.find(format->str) : kFormats.end();
        if (known == kFormats.end())
          return sdError("format '", format->type == Json::Type::String ? format->str.substr(0, 40) : "?", "' at ", where,
                         " is not supported (date, time, date-time, uuid, email, ipv4)");
        pattern = nullptr;
        auto compiled = Pattern::compile(known->second);
        if (!compiled.isOk()) return compiled.status();
        n.pattern = compiled.value();
      }
      if (pattern) {
        if (pattern->type != Json::Type::String) return sdError("pattern at ", where, " must be a string");
        auto compiled = Pattern::compile(pattern->str);
        if (!compiled.isOk()) return compiled.status().withContext("at " + where + ": ");
        n.pattern = compiled.value();
      }
    } else if (type == "number" || type == "integer") {
      n.kind = type == "number" ? Kind::Number : Kind::Integer;
      SD_RETURN_IF_ERROR(readBounds(s, where, n));
    } else if (type == "boolean" || type == "null") {
      n.kind = Kind::Literal;
      n.literals = type == "null" ? std::vector<std::string>{"null"} : std::vector<std::string>{"true", "false"};
    } else if (type == "array") {
      n.kind = Kind::Array;
      SD_RETURN_IF_ERROR(count(s, "minItems", where, n.minCount));
      SD_RETURN_IF_ERROR(count(s, "maxItems", where, n.maxCount));
      const Json *items = s.get("items");
      if (items && items->type == Json::Type::Array)
        return sdError("items at ", where, " as a list (a tuple) is not supported");
      if (items) {
        auto item = read(*items, path + "/items", depth + 1);
        if (!item.isOk()) return item.status();
        n.items = item.value();
      } else {
        n.items = any();
      }
    } else if (type == "object") {
      n.kind = Kind::Object;
      SD_RETURN_IF_ERROR(readObject(s, where, path, depth, n));
    } else {
      return sdError("type '", type.substr(0, 32), "' at ", where,
                     " is not a JSON Schema type (object, array, string, number, integer, boolean, null)");
    }
    if (n.maxCount >= 0 && n.minCount > n.maxCount)
      return sdError("the JSON schema at ", where, " asks for at least ", n.minCount, " and at most ", n.maxCount);
    return g_.add(std::move(n));
  }

  // minimum, maximum and their exclusive forms on an integer: a pattern its
  // digits follow.
  Status readBounds(const Json &s, const std::string &where, Node &n) {
    bool hasLo = false, hasHi = false;
    double lo = 0, hi = 0;
    for (const char *key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      const Json *v = s.get(key);
      if (!v) continue;
      if (n.kind == Kind::Number)
        return sdError(key, " at ", where, " on a number is not supported (on an integer it is)");
      if (v->type != Json::Type::Number || !std::isfinite(v->num) || std::fabs(v->num) > 1e15)
        return sdError(key, " at ", where, " must be a number within 1e15");
      const std::string k = key;
      const bool lower = k.find("inimum") != std::string::npos, exclusive = k[0] == 'e';
      double b = lower ? (exclusive ? std::floor(v->num) + 1 : std::ceil(v->num))
                       : (exclusive ? std::ceil(v->num) - 1 : std::floor(v->num));
      if (lower) lo = hasLo ? std::max(lo, b) : b, hasLo = true;
      else hi = hasHi ? std::min(hi, b) : b, hasHi = true;
    }
    if (!hasLo && !hasHi) return Status::ok();
    if (hasLo && hasHi && lo > hi) return sdError("no integer at ", where, " is within its minimum and maximum");
    auto p = Pattern::compile(integerRange(hasLo, int64_t(lo), hasHi, int64_t(hi)));
    if (!p.isOk()) return sdError("the range of integers at ", where, " is too wide to follow: ", p.status().message());
    n.pattern = p.value();
    return Status::ok();
  }

  Status readObject(const Json &s, const std::string &where, const std::string &path, int depth, Node &n) {
    const Json *props = s.get("properties");
    if (props && props->type != Json::Type::Object) return sdError("properties at ", where, " must be an object");
    if (props)
      for (const auto &[name, sub] : props->obj) {
        auto value = read(sub, path + "/properties/" + name, depth + 1);
        if (!value.isOk()) return value.status();
        n.properties.push_back({jsonQuote(name), value.value(), false});
      }
    if (const Json *required = s.get("required")) {
      if (required->type != Json::Type::Array) return sdError("required at ", where, " must be a list of names");
      for (const Json &r : required->arr) {
        bool found = false;
        for (auto &p : n.properties)
          if (r.type == Json::Type::String && p.key == jsonQuote(r.str)) p.required = found = true;
        if (!found)
          return sdError("required at ", where, " names '", r.type == Json::Type::String ? r.str.substr(0, 64) : "?",
                         "', which is not in its properties");
      }
    }
    const Json *extra = s.get("additionalProperties");
    if (!n.properties.empty()) return Status::ok(); // only the listed keys are written
    if (extra && extra->type == Json::Type::Bool && !extra->b) return Status::ok(); // {} only
    if (!extra || extra->type == Json::Type::Bool) {
      n.additional = any();
      return Status::ok();
    }
    auto value = read(*extra, path + "/additionalProperties", depth + 1);
    if (!value.isOk()) return value.status();
    n.additional = value.value();
    return Status::ok();
  }

  JsonGrammar &g_;
  const Json &root_;
  std::map<std::string, int32_t> refs_;
  int32_t any_ = -1;
};

} // namespace

JsonGrammar::JsonGrammar() {
  Node key; // node 0: a plain string, for the keys of objects with any keys
  key.kind = Kind::String;
  add(std::move(key));
}

void JsonGrammar::finish(int32_t root) {
  root_ = root;
  firstBytes_.assign(nodes_.size(), {});
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node &n = nodes_[i];
    std::bitset<256> &b = firstBytes_[i];
    switch (n.kind) {
    case Kind::Object: b.set('{'); break;
    case Kind::Array: b.set('['); break;
    case Kind::String: b.set('"'); break;
    case Kind::Number:
    case Kind::Integer:
      b.set('-');
      for (char c = '0'; c <= '9'; ++c) b.set(static_cast<unsigned char>(c));
      break;
    case Kind::Literal:
      for (const std::string &l : n.literals)
        if (!l.empty()) b.set(static_cast<unsigned char>(l[0]));
      break;
    case Kind::Union: break;
    }
  }
  for (bool changed = true; changed;) { // unions take their alternatives' bytes, through cycles
    changed = false;
    for (size_t i = 0; i < nodes_.size(); ++i)
      for (int32_t alt : nodes_[i].alternatives) {
        const std::bitset<256> before = firstBytes_[i];
        firstBytes_[i] |= firstBytes_[size_t(alt)];
        changed = changed || firstBytes_[i] != before;
      }
  }
}

int32_t JsonGrammar::add(Node n) {
  nodes_.push_back(std::move(n));
  return int32_t(nodes_.size() - 1);
}

int32_t JsonGrammar::addAnyValue() {
  const int32_t anyValue = add(Node());
  Node object;
  object.kind = Kind::Object;
  object.additional = anyValue;
  Node array;
  array.kind = Kind::Array;
  array.items = anyValue;
  Node number;
  number.kind = Kind::Number;
  Node words;
  words.kind = Kind::Literal;
  words.literals = {"true", "false", "null"};
  const int32_t o = add(std::move(object)), a = add(std::move(array)), n = add(std::move(number)),
                w = add(std::move(words));
  at(anyValue).alternatives = {o, a, 0, n, w};
  return anyValue;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::choice(const std::vector<std::string> &texts) {
  auto g = std::make_shared<JsonGrammar>();
  Node literal; // matched byte by byte, as any literal
  literal.kind = Kind::Literal;
  for (const std::string &t : texts)
    if (!t.empty()) literal.literals.push_back(t);
  g->finish(g->add(std::move(literal)));
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::anyObject() {
  auto g = std::make_shared<JsonGrammar>();
  Node object;
  object.kind = Kind::Object;
  object.additional = g->addAnyValue();
  g->finish(g->add(std::move(object)));
  return g;
}

StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::fromSchema(const std::string &schemaText) {
  auto parsed = parseJson(schemaText, "the JSON schema");
  if (!parsed.isOk()) return parsed.status();
  return fromSchema(parsed.value());
}

const Json &JsonGrammar::noParameters() {
  static const Json schema = parseJson(R"({"type":"object","additionalProperties":false})", "").value();
  return schema;
}

StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::toolCalls(
    const std::vector<std::pair<std::string, const Json *>> &tools, bool parallel) {
  auto g = std::make_shared<JsonGrammar>();
  Node calls;
  calls.kind = Kind::Array;
  calls.minCount = 1;
  calls.maxCount = parallel ? -1 : 1;
  Node anyCall;
  for (const auto &[name, parameters] : tools) {
    const Json &schema = parameters ? *parameters : noParameters();
    SchemaReader reader(*g, schema); // each tool's $refs within its own schema
    auto params = reader.read(schema, "", 0);
    if (!params.isOk()) return params.status().withContext("tool '" + name + "': ");
    Node literal;
    literal.kind = Kind::Literal;
    literal.literals = {jsonQuote(name)};
    Node call;
    call.kind = Kind::Object;
    call.properties = {{jsonQuote("name"), g->add(std::move(literal)), true}, {jsonQuote("parameters"), params.value(), true}};
    anyCall.alternatives.push_back(g->add(std::move(call)));
  }
  calls.items = g->add(std::move(anyCall));
  g->finish(g->add(std::move(calls)));
  return std::shared_ptr<const JsonGrammar>(std::move(g));
}

StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::fromSchema(const Json &schema) {
  auto g = std::make_shared<JsonGrammar>();
  SchemaReader reader(*g, schema);
  auto root = reader.read(schema, "", 0);
  if (!root.isOk()) return root.status();
  g->finish(root.value());
  return std::shared_ptr<const JsonGrammar>(std::move(g));
}

} // namespace sd::generate
