// Tools and tool calls of OpenAI's chat API.
#include "tool_calls.h"
#include <cctype>

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

bool parseMistralCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content) {
  static const std::string marker = "[TOOL_CALLS]";
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

size_t callTextStart(const std::string &name, const std::string &text) {
  if (name == "llama3_json") { // a call is the whole reply: one that may become one waits whole
    static const std::string tag = "<|python_tag|>";
    const size_t at = skipSpace(text, 0);
    if (at == text.size() || text[at] == '{') return 0;
    const size_t n = std::min(tag.size(), text.size() - at);
    return text.compare(at, n, tag, 0, n) == 0 ? 0 : text.size();
  }
  const std::string marker = name == "mistral" ? "[TOOL_CALLS]" : "<tool_call>";
  const size_t found = text.find(marker);
  if (found != std::string::npos) return found;
  for (size_t n = std::min(marker.size() - 1, text.size()); n > 0; --n) // a marker's start held back
    if (text.compare(text.size() - n, n, marker, 0, n) == 0) return text.size() - n;
  return text.size();
}

CallParser callParser(const std::string &name) {
  if (name == "hermes") return parseHermesCalls;
  if (name == "llama3_json") return parseLlama3JsonCalls;
  if (name == "mistral") return parseMistralCalls;
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
