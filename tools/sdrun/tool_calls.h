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

// Parsers of the calls in a reply. Each gives the calls (ids unset) and the
// text besides them; false when the text holds none.
// tool_choice "required": [{"name": ..., "parameters": {...}}, ...].
bool parseRequiredCalls(const std::string &text, std::vector<ToolCall> &calls);
// Hermes' format (Qwen2.5, Hermes and others): <tool_call>{"name": ...,
// "arguments": {...}}</tool_call>, as vLLM's hermes parser reads it.
bool parseHermesCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content);
// Llama 3.1's JSON calls: {"name": ..., "parameters": {...}} (or
// "arguments"), after an optional <|python_tag|>, several joined by ';', as
// vLLM's llama3_json parser reads them: the reply is calls or text, not both.
bool parseLlama3JsonCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content);
// Mistral's: [TOOL_CALLS] then a list [{"name": ..., "arguments": {...}}, ...].
bool parseMistralCalls(const std::string &text, std::vector<ToolCall> &calls, std::string &content);

// Where in a reply so far its calls may begin, for parser `name`: the text
// before may stream as content, the rest waits (a marker's first bytes
// included) until the reply ends. text.size() when no call can begin.
size_t callTextStart(const std::string &name, const std::string &text);

// The parser --tool-call-parser NAME names (hermes, llama3_json, mistral), or null.
using CallParser = bool (*)(const std::string &, std::vector<ToolCall> &, std::string &);
CallParser callParser(const std::string &name);

} // namespace sdrun::openai
