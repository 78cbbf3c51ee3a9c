// The OpenAI API's completions and chat completions as `sdrun serve` reads
// and answers them: a request body checked into a GenerationRequest (an
// unsupported or out-of-range field is an error naming it, never silently
// ignored), and the JSON of responses, stream chunks and errors.
#pragma once
#include "sd/generate/generator.h"
#include "sd/generate/json_grammar.h"
#include "sd/tokenize/chat_template.h"
#include <cstdint>
#include <string>
#include <vector>

namespace sdrun::openai {

struct Error {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param; // the field at fault, when one is
  std::string code;  // e.g. model_not_found
};
std::string errorJson(const Error &e);
// A 400 naming `field`: "'field' msg"; false.
bool fieldError(Error &err, const std::string &field, const std::string &msg);
// Absent or JSON null (OpenAI's clients send unset fields as null).
bool isNull(const sd::Json *v);

// A prompt as text, or as token ids (the completions API takes both).
struct Prompt {
  std::string text;
  std::vector<int64_t> ids;
  bool isIds = false;
};

// How a chat reply may call the request's tools: not at all, as the model
// chooses (its calls parsed from its text), at least one, or the one named.
enum class ToolChoice { None, Auto, Required, Named };

// A function call in a reply: arguments as JSON text.
struct ToolCall {
  std::string id, name, arguments;
};

struct GenerationRequest {
  bool chat = false;
  std::string model;
  std::vector<Prompt> prompts;            // completions: one or more
  std::vector<sd::ChatMessage> messages;  // chat
  int64_t n = 1;                          // choices per prompt
  int64_t maxTokens = -1;                 // -1: not given
  sd::generate::SamplingOptions sampling; // seed only when seedGiven
  bool seedGiven = false;
  std::vector<std::string> stop;
  bool stream = false, includeUsage = false, echo = false;
  int64_t logprobs = -1; // -1: none; k: each token's log-probability and the k likeliest (chat: top_logprobs)
  // response_format json_object or json_schema, or vLLM's guided_json /
  // guided_choice: the grammar the text follows (null: free text); vLLM's
  // guided_regex: the pattern the whole text matches.
  std::shared_ptr<const sd::generate::JsonGrammar> grammar;
  std::shared_ptr<const sd::generate::Pattern> regex;
  // Chat tools: the functions as the chat template reads them (OpenAI's
  // [{"type": "function", "function": {...}}]; null: none), and the choice.
  sd::Json tools;
  ToolChoice toolChoice = ToolChoice::None;
  std::string toolName; // Named's function
  bool parallelToolCalls = true;
};

// What the server uses where a request is silent.
struct Defaults {
  sd::generate::SamplingOptions sampling;
};

// Parses a request body for /v1/completions (chat false) or /v1/chat/completions.
bool parseRequest(const std::string &body, bool chat, const Defaults &defaults, GenerationRequest &out, Error &err);

struct Usage {
  int64_t prompt = 0, completion = 0;
};

// The fields every response and chunk starts with.
struct Head {
  std::string id, model;
  int64_t created = 0;
  bool chat = false;
};

// One token's log-probability as a response shows it: its text, and the
// likeliest tokens' (an echoed prompt's first token has none: `known` false).
struct LogprobEntry {
  std::string token;
  bool known = true;
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;
};

// The "logprobs" of a choice or chunk: completions' tokens / token_logprobs /
// top_logprobs / text_offset (offsets counted from `offset`), chat's content
// list; "null" when there are none to show.
std::string logprobsJson(bool chat, const std::vector<LogprobEntry> &entries, size_t offset);

struct ChoiceResult {
  std::string text, finishReason;
  std::string logprobs = "null"; // logprobsJson's
  std::vector<ToolCall> toolCalls; // chat: the calls (text: what the reply says besides)
};

std::string responseJson(const Head &h, const std::vector<ChoiceResult> &choices, const Usage &usage);
// A stream chunk: new text of choice `index` (chat: a delta; `role` adds the
// assistant role, as the first chunk of a chat choice carries it), and its
// finish reason when it ends ("" while not).
std::string chunkJson(const Head &h, size_t index, const std::string &text, const std::string &finishReason, bool role,
                      const std::string &logprobs = "null");
// A chat stream chunk of tool calls: `calls` the delta's list (toolCallsJson's).
std::string toolCallChunkJson(const Head &h, size_t index, const std::string &calls, const std::string &finishReason);
// Tool calls as a message's "tool_calls"; with `indexed` as stream deltas
// (each with its index, from firstIndex; `argumentsOnly` leaves out id, type
// and name: the arguments' next piece).
std::string toolCallsJson(const std::vector<ToolCall> &calls, bool indexed = false, bool argumentsOnly = false,
                          size_t firstIndex = 0);
// The last chunk of a stream with stream_options.include_usage.
std::string usageChunkJson(const Head &h, const Usage &usage);
std::string modelJson(const std::string &model, int64_t created);

// /v1/embeddings: input as text, texts, token ids or lists of them.
struct EmbeddingRequest {
  std::string model;
  std::vector<Prompt> inputs;
  bool base64 = false;     // encoding_format "base64": little-endian float32 bytes
  int64_t dimensions = -1; // -1: not given (only the model's own size is served)
};
bool parseEmbeddingRequest(const std::string &body, EmbeddingRequest &out, Error &err);
std::string embeddingsJson(const std::string &model, const std::vector<std::vector<float>> &vectors, bool base64,
                           int64_t promptTokens);

} // namespace sdrun::openai
