// Tools and tool calls of OpenAI's chat API.
#include "tool_calls.h"
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace sdrun::openai {

using sd::Json;

namespace {

const Json *toolFunction(const Json &tool) { return tool.get("function"); }

std::string toolName(const Json &tool) {
  const Json *f = toolFunction(tool);
  const Json *name = f ? f->get("name") : nullptr;
  return name ? name->str : "";
}

} // namespace

bool readTools(const Json &v, Json &tools, Error &err) {
  if (v.type != Json::Type::Array) return fieldError(err, "tools", "must be a list of {\"type\": \"function\", \"function\": {...}}");
  for (size_t k = 0; k < v.arr.size(); ++k) {
    const std::string field = "tools[" + std::to_string(k) + "]";
    const Json &t = v.arr[k];
    const Json *type = t.get("type"), *f = t.get("function");
    if (t.type != Json::Type::Object || !type || type->type != Json::Type::String || type->str != "function" || !f ||
        f->type != Json::Type::Object)
      return fieldError(err, field, "must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
    for (const auto &[key, value] : t.obj)
      if (key != "type" && key != "function") return fieldError(err, field + "." + key, "is not supported");
    const Json *name = f->get("name");
    if (!name || name->type != Json::Type::String || name->str.empty() || name->str.size() > 64)
      return fieldError(err, field + ".function.name", "must be a name of 1 to 64 characters");
    for (char c : name->str)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-')
        return fieldError(err, field + ".function.name", "may hold letters, digits, '_' and '-' only");
    for (size_t j = 0; j < k; ++j)
      if (toolName(v.arr[j]) == name->str) return fieldError(err, field + ".function.name", "repeats '" + name->str + "'");
    for (const auto &[key, value] : f->obj) {
      if (key == "name") continue;
      if (key == "description" && value.type != Json::Type::String)
        return fieldError(err, field + ".function.description", "must be a string");
      if (key == "strict" && !isNull(&value) && value.type != Json::Type::Bool)
        return fieldError(err, field + ".function.strict", "must be a boolean");
      if (key == "parameters") {
        auto g = sd::generate::JsonGrammar::fromSchema(value); // refused now, not at the first forced call
        if (!g.isOk()) return fieldError(err, field + ".function.parameters", "is refused: " + g.status().message());
      }
      if (key != "description" && key != "strict" && key != "parameters")
        return fieldError(err, field + ".function." + key, "is not supported");
    }
  }
  tools = v;
  return true;
}

bool readToolChoice(const Json &v, ToolChoice &choice, std::string &name, Error &err) {
  if (v.type == Json::Type::String) {
    if (v.str == "none") choice = ToolChoice::None;
    else if (v.str == "auto") choice = ToolChoice::Auto;
    else if (v.str == "required") choice = ToolChoice::Required;
    else return fieldError(err, "tool_choice", "must be none, auto, required or {\"type\": \"function\", ...}");
    return true;
  }
  const Json *type = v.get("type"), *f = v.get("function");
  const Json *n = f ? f->get("name") : nullptr;
  if (v.type != Json::Type::Object || !type || type->type != Json::Type::String || type->str != "function" || !n ||
      n->type != Json::Type::String)
    return fieldError(err, "tool_choice", "must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  choice = ToolChoice::Named;
  name = n->str;
  return true;
}

bool checkTools(GenerationRequest &r, bool choiceGiven, Error &err) {
  const bool any = r.tools.type == Json::Type::Array && !r.tools.arr.empty();
  if (!choiceGiven) r.toolChoice = any ? ToolChoice::Auto : ToolChoice::None; // OpenAI's defaults
  if (r.toolChoice == ToolChoice::None) return true;
  if (!any) return fieldError(err, "tool_choice", "needs tools to choose from");
  if (r.toolChoice == ToolChoice::Named) {
    bool found = false;
    for (const Json &t : r.tools.arr) found = found || toolName(t) == r.toolName;
    if (!found) return fieldError(err, "tool_choice", "names '" + r.toolName.substr(0, 64) + "', which is not in tools");
  }
  if ((r.grammar || r.regex) && r.toolChoice != ToolChoice::Auto)
    return fieldError(err, "response_format", "cannot shape a reply that tool_choice makes a tool call");
  return true;
}

sd::StatusOr<std::shared_ptr<const sd::generate::JsonGrammar>> toolGrammar(const GenerationRequest &r) {
  using sd::generate::JsonGrammar;
  std::vector<std::pair<std::string, const Json *>> tools;
  for (const Json &t : r.tools.arr) {
    const Json *params = toolFunction(t)->get("parameters");
    if (r.toolChoice == ToolChoice::Required) tools.emplace_back(toolName(t), params);
    if (r.toolChoice == ToolChoice::Named && toolName(t) == r.toolName)
      return JsonGrammar::fromSchema(params ? *params : JsonGrammar::noParameters());
  }
  if (r.toolChoice == ToolChoice::Required) return JsonGrammar::toolCalls(tools, r.parallelToolCalls);
  return std::shared_ptr<const JsonGrammar>();
}

void RequiredCallReader::expect(const char *literal, At then) {
  at_ = At::Literal;
  literal_ = literal;
  matched_ = 0;
  afterLiteral_ = then;
}

std::vector<RequiredCallReader::Piece> RequiredCallReader::feed(const std::string &more) {
  std::vector<Piece> pieces;
  for (char c : more) {
    switch (at_) {
    case At::Literal:
      if (c != literal_[matched_]) {
        at_ = At::Failed;
        break;
      }
      if (literal_[++matched_] == 0) {
        at_ = afterLiteral_;
        name_.clear();
        escaped_ = false;
      }
      break;
    case At::Name:
      if (escaped_ || c != '"') {
        escaped_ = !escaped_ && c == '\\';
        name_ += c;
        break;
      }
      if (auto name = sd::parseJson("\"" + name_ + "\"", "a tool name"); name.isOk()) {
        calls_.push_back({"", name.value().str, ""});
        pieces.push_back({calls_.size() - 1, true, name.value().str});
        expect(",\"parameters\":", At::Arguments);
        depth_ = 0;
        inString_ = escaped_ = false;
      } else {
        at_ = At::Failed;
      }
      break;
    case At::Arguments:
      if (!inString_ && (c == '}' || c == ']') && depth_ == 0) { // the call's own '}'
        at_ = c == '}' ? At::Between : At::Failed;
        break;
      }
      if (inString_) {
        if (escaped_) escaped_ = false;
        else if (c == '\\') escaped_ = true;
        else if (c == '"') inString_ = false;
      } else if (c == '"') {
        inString_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if (c == '}' || c == ']') {
        --depth_;
      }
      calls_.back().arguments += c;
      if (pieces.empty() || pieces.back().name || pieces.back().call != calls_.size() - 1)
        pieces.push_back({calls_.size() - 1, false, ""});
      pieces.back().text += c;
      break;
    case At::Between:
      if (c == ',') expect("{\"name\":\"", At::Name);
      else at_ = c == ']' ? At::End : At::Failed;
      break;
    case At::End:
    case At::Failed:
      at_ = At::Failed;
      break;
    }
  }
  return pieces;
}

namespace {

// A call object's name and its arguments ("arguments", or Llama's "parameters").
bool callFrom(const Json &c, ToolCall &out) {
  const Json *name = c.get("name"), *args = c.get("arguments");
  if (!args) args = c.get("parameters");
  if (!name || name->type != Json::Type::String || !args) return false;
  out = {"", name->str, args->type == Json::Type::String ? args->str : sd::jsonCompact(*args)};
  return true;
}

// Where the JSON object starting at text[at] ('{') ends (one past its '}'), or npos.
size_t objectEnd(const std::string &text, size_t at) {
  int depth = 0;
  bool inString = false;
  for (size_t i = at; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\') ++i;
      else if (c == '"') inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string::npos;
}

size_t skipSpace(const std::string &text, size_t at) {
  while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
  return at;
}

} // namespace

bool parseLlama3JsonCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content) {
  static const std::string tag = "<|python_tag|>";
  size_t at = skipSpace(text, 0);
  if (text.compare(at, tag.size(), tag) == 0) at = skipSpace(text, at + tag.size());
  std::vector<ToolCall> found;
  while (at < text.size() && text[at] == '{') {
    const size_t end = objectEnd(text, at);
    if (end == std::string::npos) return false;
    auto parsed = sd::parseJson(text.substr(at, end - at), "a call");
    ToolCall call;
    if (!parsed.isOk() || !callFrom(parsed.value(), call)) return false;
    found.push_back(std::move(call));
    at = skipSpace(text, end);
    if (at < text.size() && text[at] == ';') at = skipSpace(text, at + 1);
  }
  if (found.empty() || at != text.size()) return false;
  calls = std::move(found);
  content.clear();
  return true;
}

namespace {

// A list of call objects after `marker` (Mistral's, Granite's); the text before it is content.
bool parseMarkedList(const std::string &text, const std::string &marker, std::vector<ToolCall> &calls,
                     std::string &content) {
  const size_t first = text.find(marker);
  if (first == std::string::npos) return false;
  auto parsed = sd::parseJson(text.substr(first + marker.size()), "the calls");
  if (!parsed.isOk() || parsed.value().type != Json::Type::Array || parsed.value().arr.empty()) return false;
  std::vector<ToolCall> found;
  for (const Json &c : parsed.value().arr) {
    ToolCall call;
    if (!callFrom(c, call)) return false;
    found.push_back(std::move(call));
  }
  content = text.substr(0, first);
  while (!content.empty() && std::isspace(static_cast<unsigned char>(content.back()))) content.pop_back();
  calls = std::move(found);
  return true;
}

// Where `marker` is in the text, or where a start of it ends the text (held
// back until the text tells), else text.size().
size_t markerStart(const std::string &text, const std::string &marker) {
  const size_t found = text.find(marker);
  if (found != std::string::npos) return found;
  for (size_t n = std::min(marker.size() - 1, text.size()); n > 0; --n)
    if (text.compare(text.size() - n, n, marker, 0, n) == 0) return text.size() - n;
  return text.size();
}

} // namespace

bool parseMistralCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content) {
  return parseMarkedList(text, "[TOOL_CALLS]", calls, content);
}

bool parseGraniteCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content) {
  return parseMarkedList(text, "<|tool_call|>", calls, content) || parseMarkedList(text, "<tool_call>", calls, content);
}

size_t callTextStart(const std::string &name, const std::string &text) {
  if (name == "llama3_json" || name == "pythonic") { // a call is the whole reply: one that may become one waits whole
    const std::string tag = name == "pythonic" ? "<|python_start|>" : "<|python_tag|>";
    const size_t at = skipSpace(text, 0);
    if (at == text.size() || text[at] == (name == "pythonic" ? '[' : '{')) return 0;
    const size_t n = std::min(tag.size(), text.size() - at);
    return text.compare(at, n, tag, 0, n) == 0 ? 0 : text.size();
  }
  if (name == "granite") return std::min(markerStart(text, "<|tool_call|>"), markerStart(text, "<tool_call>"));
  return markerStart(text, name == "mistral" ? "[TOOL_CALLS]" : "<tool_call>");
}

CallParser callParser(const std::string &name) {
  if (name == "hermes") return parseHermesCalls;
  if (name == "llama3_json") return parseLlama3JsonCalls;
  if (name == "mistral") return parseMistralCalls;
  if (name == "granite") return parseGraniteCalls;
  if (name == "pythonic") return parsePythonicCalls;
  return nullptr;
}

bool parseHermesCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content) {
  static const std::string open = "<tool_call>", close = "</tool_call>";
  const size_t first = text.find(open);
  if (first == std::string::npos) return false;
  std::vector<ToolCall> found;
  for (size_t at = first; (at = text.find(open, at)) != std::string::npos;) {
    const size_t begin = at + open.size(), end = text.find(close, begin);
    // An unclosed last call (the reply ended there) is read to the end, as vLLM reads it.
    auto parsed = sd::parseJson(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin), "a call");
    ToolCall call;
    if (!parsed.isOk() || !callFrom(parsed.value(), call)) return false;
    found.push_back(std::move(call));
    if (end == std::string::npos) break;
    at = end + close.size();
  }
  content = text.substr(0, first);
  while (!content.empty() && std::isspace(static_cast<unsigned char>(content.back()))) content.pop_back();
  calls = std::move(found);
  return true;
}

} // namespace sdrun::openai

namespace sdrun::openai {
namespace {

// Python's call syntax and literals read into JSON text (vLLM reads them with
// ast.literal_eval): what a model writes is untrusted, so depth is bounded and
// anything else makes the reply not a call.
class PythonCalls {
public:
  explicit PythonCalls(const std::string &text) : t_(text) {}

  bool calls(size_t from, size_t to, std::vector<ToolCall> &out) {
    at_ = from;
    end_ = to;
    if (!eat('[')) return false;
    do {
      ToolCall call;
      if (!identifier(call.name) || !eat('(')) return false;
      call.arguments = "{";
      if (!peek(')')) {
        do {
          std::string key;
          if (!identifier(key) || !eat('=')) return false;
          if (call.arguments.size() > 1) call.arguments += ',';
          call.arguments += sd::jsonQuote(key) + ':';
          if (!value(call.arguments, 0)) return false;
        } while (eat(','));
      }
      call.arguments += '}';
      if (!eat(')')) return false;
      out.push_back(std::move(call));
    } while (eat(','));
    return eat(']') && (space(), at_ == end_);
  }

private:
  void space() {
    while (at_ < end_ && std::isspace(static_cast<unsigned char>(t_[at_]))) ++at_;
  }
  bool peek(char c) {
    space();
    return at_ < end_ && t_[at_] == c;
  }
  bool eat(char c) {
    if (!peek(c)) return false;
    ++at_;
    return true;
  }
  bool word(const char *w) {
    const size_t n = std::strlen(w);
    if (t_.compare(at_, n, w) != 0) return false;
    if (at_ + n < end_ && (std::isalnum(static_cast<unsigned char>(t_[at_ + n])) || t_[at_ + n] == '_')) return false;
    at_ += n;
    return true;
  }
  bool identifier(std::string &out) {
    space();
    const size_t from = at_;
    while (at_ < end_ && (std::isalnum(static_cast<unsigned char>(t_[at_])) || t_[at_] == '_')) ++at_;
    out = t_.substr(from, at_ - from);
    return !out.empty() && !std::isdigit(static_cast<unsigned char>(out[0]));
  }
  static void utf8(uint32_t cp, std::string &out) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
    }
  }
  bool string(std::string &out) { // '...' or "...", Python's escapes
    space();
    if (at_ >= end_ || (t_[at_] != '\'' && t_[at_] != '"')) return false;
    const char quote = t_[at_++];
    while (at_ < end_ && t_[at_] != quote) {
      char c = t_[at_++];
      if (c == '\n') return false;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= end_) return false;
      c = t_[at_++];
      static const char kEscapes[] = "nrtbfav\\'\"", kMeans[] = "\n\r\t\b\f\a\v\\'\"";
      if (const char *plain = c ? std::strchr(kEscapes, c) : nullptr) {
        out += kMeans[plain - kEscapes];
        continue;
      }
      if (c >= '0' && c <= '7') { // octal: up to three digits
        uint32_t cp = uint32_t(c - '0');
        for (int k = 0; k < 2 && at_ < end_ && t_[at_] >= '0' && t_[at_] <= '7'; ++k) cp = cp * 8 + uint32_t(t_[at_++] - '0');
        utf8(cp, out);
        continue;
      }
      const int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
      if (!digits || at_ + size_t(digits) > end_) return false;
      uint32_t cp = 0;
      for (int k = 0; k < digits; ++k) {
        const char h = t_[at_++];
        if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
        cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
      }
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
      utf8(cp, out);
    }
    return at_++ < end_;
  }
  bool number(std::string &out) {
    space();
    const size_t from = at_;
    if (at_ < end_ && (t_[at_] == '-' || t_[at_] == '+')) ++at_;
    std::string digits = at_ > from && t_[from] == '-' ? "-" : "";
    while (at_ < end_ && (std::isdigit(static_cast<unsigned char>(t_[at_])) || std::strchr("._eE+-", t_[at_]))) {
      if (t_[at_] != '_') digits += t_[at_];
      ++at_;
    }
    char *stop = nullptr;
    const double v = std::strtod(digits.c_str(), &stop);
    if (digits.empty() || digits == "-" || *stop || !std::isfinite(v)) return false;
    const bool integral = digits.find_first_of(".eE") == std::string::npos;
    if (!integral) { // a float stays one, as json.dumps writes Python's: 5.0, not 5
      const std::string written = sd::jsonNumber(v);
      out += written.find_first_not_of("-0123456789") == std::string::npos ? written + ".0" : written;
      return true;
    }
    // An integer as written (exact past 2^53); Python refuses leading zeros (007), and so does this.
    const size_t sign = digits[0] == '-';
    if (digits.size() > sign + 1 && digits[sign] == '0') return false;
    out += digits;
    return true;
    return true;
  }
  bool value(std::string &out, int depth) {
    if (depth > 64) return false;
    space();
    if (at_ >= end_) return false;
    const char c = t_[at_];
    if (c == '\'' || c == '"') {
      std::string s;
      if (!string(s)) return false;
      out += sd::jsonQuote(s);
      return true;
    }
    if (word("True")) return out += "true", true;
    if (word("False")) return out += "false", true;
    if (word("None")) return out += "null", true;
    if (c == '[' || c == '(') { // a list or a tuple: an array
      const char close = c == '[' ? ']' : ')';
      ++at_;
      out += '[';
      for (bool first = true; !peek(close); first = false) {
        if (!first && !eat(',')) return false;
        if (peek(close)) break; // a trailing comma
        if (!first) out += ',';
        if (!value(out, depth + 1)) return false;
      }
      ++at_;
      return out += ']', true;
    }
    if (c == '{') {
      ++at_;
      out += '{';
      for (bool first = true; !peek('}'); first = false) {
        if (!first && !eat(',')) return false;
        if (peek('}')) break;
        std::string key;
        if (!string(key) || !eat(':')) return false;
        out += std::string(first ? "" : ",") + sd::jsonQuote(key) + ':';
        if (!value(out, depth + 1)) return false;
      }
      ++at_;
      return out += '}', true;
    }
    return number(out);
  }

  const std::string &t_;
  size_t at_ = 0, end_ = 0;
};

} // namespace

bool parsePythonicCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content) {
  static const std::string start = "<|python_start|>", end = "<|python_end|>";
  size_t from = skipSpace(text, 0), to = text.size();
  while (to > from && std::isspace(static_cast<unsigned char>(text[to - 1]))) --to;
  if (text.compare(from, start.size(), start) == 0) from += start.size();
  if (to >= from + end.size() && text.compare(to - end.size(), end.size(), end) == 0) to -= end.size();
  std::vector<ToolCall> found;
  if (!PythonCalls(text).calls(from, to, found) || found.empty()) return false;
  calls = std::move(found);
  content.clear();
  return true;
}

} // namespace sdrun::openai
