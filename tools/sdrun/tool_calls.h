// Tool calling in `sdrun serve`, as OpenAI's chat API has it: a request's
// tools and tool_choice (an assistant turn's tool_calls are read with the
// messages, sd::chatMessagesFromJson), the grammar a forced call is generated under, and the calls in
// generated text: a "required" reply's list, or (tool_choice "auto", with
// --tool-call-parser) the calls a model writes in its own chat format.
#pragma once
#include "openai_api.h"
#include "sd/format/json.h"
#include "sd/generate/json_grammar.h"
#include <memory>
#include <string>
#include <vector>

namespace sdrun::openai {

// "tools": [{"type": "function", "function": {"name", "description",
// "parameters", "strict"}}], each parameters schema one the grammar can follow.
bool readTools(const sd::Json &v, sd::Json &tools, Error &err);
// "tool_choice": "none", "auto", "required" or {"type": "function", "function": {"name"}}.
bool readToolChoice(const sd::Json &v, ToolChoice &choice, std::string &name, Error &err);
// After the whole request is read: the default choice ("auto" with tools),
// and a choice that names no tool, or asks for tools there are none of, or
// fights response_format, refused.
bool checkTools(GenerationRequest &r, bool choiceGiven, Error &err);

// The grammar a chat reply follows for its tool choice: the named function's
// parameters, or "required"'s list of calls; null for none and auto.
sd::StatusOr<std::shared_ptr<const sd::generate::JsonGrammar>> toolGrammar(const GenerationRequest &r);

// tool_choice "required"'s reply read as it comes: the list of calls its
// grammar writes ([{"name":"f","parameters":{...}},...], compact JSON), byte by
// byte, so a stream sends each call's name as soon as it is whole and its
// arguments (the bytes the model wrote) as they come, and a finished reply's
// calls are the same reading's.
class RequiredCallReader {
public:
  struct Piece {
    size_t call = 0;   // which call of the list
    bool name = false; // the call's name (the call begins), else bytes of its arguments
    std::string text;
  };
  // What `more` adds: names, and argument bytes (a run of them one piece).
  std::vector<Piece> feed(const std::string &more);
  // The calls so far (ids unset; the last one's arguments cut where the text is).
  const std::vector<ToolCall> &calls() const { return calls_; }
  bool whole() const { return at_ == At::End; } // the list is closed

private:
  enum class At { Literal, Name, Arguments, Between, End, Failed };
  void expect(const char *literal, At then);
  At at_ = At::Literal, afterLiteral_ = At::Name;
  const char *literal_ = "[{\"name\":\"";
  size_t matched_ = 0;
  std::string name_; // the name's JSON text between its quotes, escapes as written
  bool inString_ = false, escaped_ = false;
  int depth_ = 0; // the arguments' nesting
  std::vector<ToolCall> calls_;
};

// Parsers of the calls a model writes in its own format. Each gives the calls
// (ids unset) and the text besides them; false when the text holds none.
// Hermes' format (Qwen2.5, Hermes and others): <tool_call>{"name": ...,
// "arguments": {...}}</tool_call>, as vLLM's hermes parser reads it.
bool parseHermesCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content);
// Llama 3.1's JSON calls: {"name": ..., "parameters": {...}} (or
// "arguments"), after an optional <|python_tag|>, several joined by ';', as
// vLLM's llama3_json parser reads them: the reply is calls or text, not both.
bool parseLlama3JsonCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content);
// Mistral's: [TOOL_CALLS] then a list [{"name": ..., "arguments": {...}}, ...].
bool parseMistralCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content);
// Granite's: <|tool_call|> (or <tool_call>) then such a list, as vLLM's granite parser reads it.
bool parseGraniteCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content);
// Python's call syntax (Llama 3.2 and 4, as vLLM's pythonic parser reads it):
// the whole reply a list [get_weather(city="Paris", days=[1, 2]), f()], the
// keyword arguments Python literals (strings, numbers, True/False/None,
// lists, tuples, dicts), given as a JSON object.
bool parsePythonicCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content);

// Where in a reply so far its calls may begin, for parser `name`: the text
// before may stream as content, the rest waits (a marker's first bytes
// included) until the reply ends. text.size() when no call can begin.
size_t callTextStart(const std::string &name, const std::string &text);

// The parser --tool-call-parser NAME names (hermes, llama3_json, mistral,
// granite, pythonic), or null.
using CallParser = bool (*)(const std::string &, std::vector<ToolCall> &, std::string &);
CallParser callParser(const std::string &name);

} // namespace sdrun::openai
