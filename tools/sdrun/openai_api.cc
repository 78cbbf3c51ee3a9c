// Reading OpenAI completion requests and writing their responses.
#include "openai_api.h"
#include "tool_calls.h"
#include "sd/generate/regex_constraint.h"
#include "sd/format/json.h"
#include <cmath>
#include <set>

namespace sdrun::openai {

using sd::Json;

bool fieldError(Error &err, const std::string &field, const std::string &msg) {
  err.status = 400;
  err.param = field;
  err.message = "'" + field + "' " + msg;
  return false;
}

bool isNull(const Json *v) { return !v || v->type == Json::Type::Null; }

namespace {

bool readBool(const Json &v, const std::string &field, bool &out, Error &err) {
  if (v.type != Json::Type::Bool) return fieldError(err, field, "must be true or false");
  out = v.b;
  return true;
}

bool readNumber(const Json &v, const std::string &field, double lo, double hi, double &out, Error &err) {
  if (v.type != Json::Type::Number || !std::isfinite(v.num) || v.num < lo || v.num > hi)
    return fieldError(err, field, "must be a number in [" + sd::jsonNumber(lo) + ", " + sd::jsonNumber(hi) + "]");
  out = v.num;
  return true;
}

bool readInt(const Json &v, const std::string &field, int64_t lo, int64_t hi, int64_t &out, Error &err) {
  if (v.type != Json::Type::Number || !v.isInteger() || v.num < double(lo) || v.num > double(hi))
    return fieldError(err, field, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  out = int64_t(v.num);
  return true;
}

bool readIds(const Json &v, const std::string &field, std::vector<int64_t> &out, Error &err) {
  for (const Json &t : v.arr) {
    if (t.type != Json::Type::Number || !t.isInteger() || t.num < 0 || t.num > 2147483647.0)
      return fieldError(err, field, "token ids must be integers >= 0");
    out.push_back(int64_t(t.num));
  }
  return true;
}

// A string, a list of strings, a list of token ids, or a list of such lists.
bool readPrompt(const Json &v, std::vector<Prompt> &out, Error &err, const std::string &field = "prompt") {
  if (v.type == Json::Type::String) {
    out.push_back({v.str, {}, false});
    return true;
  }
  if (v.type != Json::Type::Array || v.arr.empty())
    return fieldError(err, field, "must be a string, a list of strings, or token ids (a list, or a list of lists)");
  if (v.arr[0].type == Json::Type::Number) {
    Prompt p;
    p.isIds = true;
    if (!readIds(v, field, p.ids, err)) return false;
    out.push_back(std::move(p));
    return true;
  }
  for (const Json &e : v.arr) {
    if (e.type == Json::Type::String) {
      out.push_back({e.str, {}, false});
    } else if (e.type == Json::Type::Array && !e.arr.empty()) {
      Prompt p;
      p.isIds = true;
      if (!readIds(e, field, p.ids, err)) return false;
      out.push_back(std::move(p));
    } else {
      return fieldError(err, field, "must be a string, a list of strings, or token ids (a list, or a list of lists)");
    }
  }
  return true;
}

// Chat messages, read as data lines' are (sd::chatMessagesFromJson).
bool readMessages(const Json &v, std::vector<sd::ChatMessage> &out, Error &err) {
  if (auto st = sd::chatMessagesFromJson(v, out); !st.isOk()) {
    err.status = 400;
    err.param = "messages";
    err.message = st.message();
    return false;
  }
  return true;
}

bool readStop(const Json &v, std::vector<std::string> &out, Error &err) {
  if (v.type == Json::Type::String) {
    if (!v.str.empty()) out.push_back(v.str);
    return true;
  }
  if (v.type != Json::Type::Array || v.arr.size() > 16)
    return fieldError(err, "stop", "must be a string or a list of up to 16 strings");
  for (const Json &s : v.arr) {
    if (s.type != Json::Type::String) return fieldError(err, "stop", "must be a string or a list of up to 16 strings");
    if (!s.str.empty()) out.push_back(s.str);
  }
  return true;
}

// response_format: text, json_object (any JSON object) or json_schema
// ({"name", "schema", "strict", "description"}), as OpenAI takes it.
bool readResponseFormat(const Json &v, std::shared_ptr<const sd::generate::JsonGrammar> &grammar, Error &err) {
  const std::string key = "response_format";
  const Json *type = v.get("type");
  if (v.type != Json::Type::Object || !type || type->type != Json::Type::String)
    return fieldError(err, key, "must be an object with a \"type\": text, json_object or json_schema");
  for (const auto &[k, o] : v.obj)
    if (k != "type" && !(k == "json_schema" && type->str == "json_schema"))
      return fieldError(err, key + "." + k, "is not a field of a " + type->str.substr(0, 20) + " response format");
  if (type->str == "text") {
    grammar = nullptr;
    return true;
  }
  if (type->str == "json_object") {
    grammar = sd::generate::JsonGrammar::anyObject();
    return true;
  }
  if (type->str != "json_schema")
    return fieldError(err, key + ".type", "must be text, json_object or json_schema, not '" + type->str.substr(0, 40) + "'");
  const Json *spec = v.get("json_schema");
  if (!spec || spec->type != Json::Type::Object) return fieldError(err, key + ".json_schema", "is required (an object)");
  const Json *schema = nullptr;
  for (const auto &[k, o] : spec->obj) {
    if (k == "schema") schema = &o;
    else if (k == "name" || k == "description") {
      if (o.type != Json::Type::String) return fieldError(err, key + ".json_schema." + k, "must be a string");
    } else if (k == "strict") {
      if (!isNull(&o) && o.type != Json::Type::Bool) return fieldError(err, key + ".json_schema.strict", "must be a boolean");
    } else {
      return fieldError(err, key + ".json_schema." + k, "is not supported (name, description, schema, strict)");
    }
  }
  if (!spec->get("name")) return fieldError(err, key + ".json_schema.name", "is required");
  Json anyValue; // no schema: any JSON value
  anyValue.type = Json::Type::Object;
  auto compiled = sd::generate::JsonGrammar::fromSchema(schema ? *schema : anyValue);
  if (!compiled.isOk()) return fieldError(err, key + ".json_schema.schema", "is refused: " + compiled.status().message());
  grammar = compiled.value();
  return true;
}

// vLLM's structured-output fields: guided_json (a schema, or its text),
// guided_regex, guided_choice, or structured_outputs {json | regex | choice}.
bool readGuided(const std::string &key, const Json &v, GenerationRequest &out, Error &err) {
  using sd::generate::JsonGrammar;
  if (key == "structured_outputs") {
    if (v.type != Json::Type::Object || v.obj.size() != 1)
      return fieldError(err, key, "must be an object with one of json, regex, choice");
    const std::string &kind = v.obj[0].first;
    if (kind != "json" && kind != "regex" && kind != "choice")
      return fieldError(err, key + "." + kind, "is not supported (json, regex, choice)");
    return readGuided("guided_" + kind, v.obj[0].second, out, err);
  }
  if (key == "guided_regex") {
    if (v.type != Json::Type::String) return fieldError(err, key, "must be a string");
    auto p = sd::generate::Pattern::compile(v.str, sd::generate::Pattern::Match::Whole);
    if (!p.isOk()) return fieldError(err, key, "is refused: " + p.status().message());
    out.regex = p.value();
    return true;
  }
  if (key == "guided_choice") {
    std::vector<std::string> texts;
    for (const Json &c : v.arr)
      if (c.type == Json::Type::String && !c.str.empty()) texts.push_back(c.str);
    if (v.type != Json::Type::Array || texts.empty() || texts.size() != v.arr.size())
      return fieldError(err, key, "must be a non-empty list of non-empty strings");
    out.grammar = JsonGrammar::choice(texts);
    return true;
  }
  auto schema = v.type == Json::Type::String ? JsonGrammar::fromSchema(v.str) : JsonGrammar::fromSchema(v);
  if (!schema.isOk()) return fieldError(err, key, "is refused: " + schema.status().message());
  out.grammar = schema.value();
  return true;
}

// Fields accepted only at the value that asks for nothing we do not do.
bool neutral(const std::string &key, const Json &v, Error &err) {
  if (isNull(&v)) return true;
  if (key == "best_of") {
    if (v.type == Json::Type::Number && v.num == 1) return true;
    return fieldError(err, key, "is not supported (only 1)");
  }
  if (key == "tools" || key == "tool_choice") { // only chats call tools (completions reach here)
    if ((v.type == Json::Type::Array && v.arr.empty()) || (v.type == Json::Type::String && v.str == "none")) return true;
    return fieldError(err, key, "is for /v1/chat/completions; completions call no tools");
  }
  if (key == "suffix") {
    if (v.type == Json::Type::String && v.str.empty()) return true;
    return fieldError(err, key, "is not supported");
  }
  return fieldError(err, key, "is not supported");
}

std::string usageJson(const Usage &u) {
  return "{\"prompt_tokens\":" + std::to_string(u.prompt) + ",\"completion_tokens\":" + std::to_string(u.completion) +
         ",\"total_tokens\":" + std::to_string(u.prompt + u.completion) + "}";
}

std::string headJson(const Head &h, const char *object) {
  return "{\"id\":" + sd::jsonQuote(h.id) + ",\"object\":\"" + object + "\",\"created\":" + std::to_string(h.created) +
         ",\"model\":" + sd::jsonQuote(h.model);
}

std::string finishJson(const std::string &reason) { return reason.empty() ? "null" : sd::jsonQuote(reason); }

} // namespace

std::string errorJson(const Error &e) {
  return "{\"error\":{\"message\":" + sd::jsonQuote(e.message) + ",\"type\":" + sd::jsonQuote(e.type) +
         ",\"param\":" + (e.param.empty() ? "null" : sd::jsonQuote(e.param)) +
         ",\"code\":" + (e.code.empty() ? "null" : sd::jsonQuote(e.code)) + "}}";
}

bool parseRequest(const std::string &body, bool chat, const Defaults &defaults, GenerationRequest &out, Error &err) {
  out = GenerationRequest();
  out.chat = chat;
  out.sampling = defaults.sampling;
  auto doc = sd::parseJson(body, "the request body");
  if (!doc.isOk()) {
    err.status = 400;
    err.message = doc.status().message();
    return false;
  }
  const Json &j = doc.value();
  if (j.type != Json::Type::Object) {
    err.status = 400;
    err.message = "the request body must be a JSON object";
    return false;
  }
  static const std::set<std::string> common = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                                                "stream", "stream_options", "repetition_penalty", "n", "user",
                                                "logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
                                                "response_format", "guided_json", "guided_regex", "guided_choice",
                                                "structured_outputs"};
  int shapes = 0; // response_format (not text), guided_*, structured_outputs: one at most
  static const std::set<std::string> completions = {"prompt", "echo"};
  static const std::set<std::string> chats = {"messages", "max_completion_tokens", "top_logprobs", "parallel_tool_calls",
                                              "tools", "tool_choice"};
  bool toolChoiceGiven = false;
  int64_t topLogprobs = -1;
  for (const auto &[key, v] : j.obj) { // a repeated key has its last value, as Python's json reads it
    const bool known = common.count(key) || (chat ? chats : completions).count(key);
    if (!known) {
      if (!neutral(key, v, err)) return false;
      continue;
    }
    if (isNull(&v)) continue; // null: the default, as the OpenAI clients send unset fields
    if (key == "model") {
      if (v.type != Json::Type::String) return fieldError(err, key, "must be a string");
      out.model = v.str;
    } else if (key == "prompt") {
      if (!readPrompt(v, out.prompts, err)) return false;
    } else if (key == "messages") {
      if (!readMessages(v, out.messages, err)) return false;
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      // 0 (completions): nothing generated, as when an echoed prompt is only scored
      if (!readInt(v, key, chat ? 1 : 0, 1 << 20, out.maxTokens, err)) return false;
    } else if (key == "logprobs") {
      if (chat) { // true: the tokens' log-probabilities, top_logprobs of the likeliest
        bool on = false;
        if (!readBool(v, key, on, err)) return false;
        if (on && out.logprobs < 0) out.logprobs = 0;
      } else if (v.type == Json::Type::Bool && !v.b) {
        // false: none
      } else if (!readInt(v, key, 0, 20, out.logprobs, err)) {
        return false;
      }
    } else if (key == "temperature") {
      if (!readNumber(v, key, 0, 2, out.sampling.temperature, err)) return false;
    } else if (key == "top_p") {
      if (!readNumber(v, key, 1e-9, 1, out.sampling.topP, err)) return false;
    } else if (key == "top_k") { // vLLM's: -1 or 0 for the whole vocabulary
      if (!readInt(v, key, -1, 1 << 20, out.sampling.topK, err)) return false;
      if (out.sampling.topK < 0) out.sampling.topK = 0;
    } else if (key == "presence_penalty") {
      if (!readNumber(v, key, -2, 2, out.sampling.presencePenalty, err)) return false;
    } else if (key == "frequency_penalty") {
      if (!readNumber(v, key, -2, 2, out.sampling.frequencyPenalty, err)) return false;
    } else if (key == "logit_bias") { // {"token id": bias in [-100, 100]}
      if (v.type != Json::Type::Object) return fieldError(err, key, "must be an object of token ids to biases");
      for (const auto &[id, bias] : v.obj) {
        if (id.empty() || id.size() > 10 || id.find_first_not_of("0123456789") != std::string::npos)
          return fieldError(err, key, "keys must be token ids, not '" + id.substr(0, 20) + "'");
        double b = 0;
        if (!readNumber(bias, key + "[" + id + "]", -100, 100, b, err)) return false;
        out.sampling.logitBias.emplace_back(std::stoll(id), float(b));
      }
    } else if (key == "response_format") {
      if (!readResponseFormat(v, out.grammar, err)) return false;
      if (out.grammar && ++shapes > 1) return fieldError(err, key, "and vLLM's guided fields: give one");
    } else if (key.rfind("guided_", 0) == 0 || key == "structured_outputs") {
      if (!readGuided(key, v, out, err)) return false;
      if (++shapes > 1) return fieldError(err, key, "and response_format or other guided fields: give one");
    } else if (key == "repetition_penalty") {
      if (!readNumber(v, key, 1e-3, 1e3, out.sampling.repetitionPenalty, err)) return false;
    } else if (key == "seed") {
      int64_t seed;
      if (!readInt(v, key, INT64_MIN / 2, INT64_MAX / 2, seed, err)) return false;
      out.sampling.seed = uint64_t(seed);
      out.seedGiven = true;
    } else if (key == "stop") {
      if (!readStop(v, out.stop, err)) return false;
    } else if (key == "stream") {
      if (!readBool(v, key, out.stream, err)) return false;
    } else if (key == "stream_options") {
      if (v.type != Json::Type::Object) return fieldError(err, key, "must be an object");
      for (const auto &[k, o] : v.obj) {
        if (k != "include_usage") return fieldError(err, key + "." + k, "is not supported");
        if (!isNull(&o) && !readBool(o, key + "." + k, out.includeUsage, err)) return false;
      }
    } else if (key == "echo") {
      if (!readBool(v, key, out.echo, err)) return false;
    } else if (key == "n") {
      if (!readInt(v, key, 1, 16, out.n, err)) return false;
    } else if (key == "user") {
      if (v.type != Json::Type::String) return fieldError(err, key, "must be a string");
    } else if (key == "top_logprobs") {
      if (!readInt(v, key, 0, 20, topLogprobs, err)) return false;
    } else if (key == "tools") {
      if (!readTools(v, out.tools, err)) return false;
    } else if (key == "tool_choice") {
      if (!readToolChoice(v, out.toolChoice, out.toolName, err)) return false;
      toolChoiceGiven = true;
    } else if (key == "parallel_tool_calls") {
      if (!readBool(v, key, out.parallelToolCalls, err)) return false;
    }
  }
  if (chat && !checkTools(out, toolChoiceGiven, err)) return false;
  if (chat && topLogprobs >= 0) {
    if (out.logprobs < 0 && topLogprobs > 0) return fieldError(err, "top_logprobs", "needs \"logprobs\": true");
    if (out.logprobs >= 0) out.logprobs = topLogprobs;
  }
  if (chat && out.messages.empty()) return fieldError(err, "messages", "is required");
  if (!chat && out.prompts.empty()) return fieldError(err, "prompt", "is required");
  if (out.includeUsage && !out.stream) return fieldError(err, "stream_options", "is only allowed with \"stream\": true");
  return true;
}

std::string responseJson(const Head &h, const std::vector<ChoiceResult> &choices, const Usage &usage) {
  std::string s = headJson(h, h.chat ? "chat.completion" : "text_completion") + ",\"choices\":[";
  for (size_t i = 0; i < choices.size(); ++i) {
    s += (i ? ",{\"index\":" : "{\"index\":") + std::to_string(i);
    if (h.chat && !choices[i].toolCalls.empty())
      s += ",\"message\":{\"role\":\"assistant\",\"content\":" +
           (choices[i].text.empty() ? std::string("null") : sd::jsonQuote(choices[i].text)) +
           ",\"tool_calls\":" + toolCallsJson(choices[i].toolCalls) + "}";
    else if (h.chat)
      s += ",\"message\":{\"role\":\"assistant\",\"content\":" + sd::jsonQuote(choices[i].text) + "}";
    else
      s += ",\"text\":" + sd::jsonQuote(choices[i].text);
    s += ",\"logprobs\":" + choices[i].logprobs + ",\"finish_reason\":" + finishJson(choices[i].finishReason) + "}";
  }
  return s + "],\"usage\":" + usageJson(usage) + "}";
}

std::string chunkJson(const Head &h, size_t index, const std::string &text, const std::string &finishReason, bool role,
                      const std::string &logprobs) {
  std::string s = headJson(h, h.chat ? "chat.completion.chunk" : "text_completion") +
                  ",\"choices\":[{\"index\":" + std::to_string(index);
  if (h.chat) {
    s += ",\"delta\":{";
    if (role) s += "\"role\":\"assistant\"";
    if (role || !text.empty()) s += std::string(role ? "," : "") + "\"content\":" + sd::jsonQuote(text);
    s += "}";
  } else {
    s += ",\"text\":" + sd::jsonQuote(text);
  }
  return s + ",\"logprobs\":" + logprobs + ",\"finish_reason\":" + finishJson(finishReason) + "}]}";
}

std::string toolCallsJson(const std::vector<ToolCall> &calls, bool indexed, bool argumentsOnly, size_t firstIndex) {
  std::string s = "[";
  for (size_t k = 0; k < calls.size(); ++k) {
    s += k ? ",{" : "{";
    if (indexed) s += "\"index\":" + std::to_string(firstIndex + k) + ",";
    if (!argumentsOnly)
      s += "\"id\":" + sd::jsonQuote(calls[k].id) + ",\"type\":\"function\",\"function\":{\"name\":" +
           sd::jsonQuote(calls[k].name) + ",\"arguments\":" + sd::jsonQuote(calls[k].arguments) + "}}";
    else
      s += "\"function\":{\"arguments\":" + sd::jsonQuote(calls[k].arguments) + "}}";
  }
  return s + "]";
}

std::string toolCallChunkJson(const Head &h, size_t index, const std::string &calls, const std::string &finishReason) {
  return headJson(h, "chat.completion.chunk") + ",\"choices\":[{\"index\":" + std::to_string(index) +
         ",\"delta\":{\"tool_calls\":" + calls + "},\"logprobs\":null,\"finish_reason\":" + finishJson(finishReason) +
         "}]}";
}

std::string usageChunkJson(const Head &h, const Usage &usage) {
  return headJson(h, h.chat ? "chat.completion.chunk" : "text_completion") + ",\"choices\":[],\"usage\":" +
         usageJson(usage) + "}";
}

namespace {

std::string bytesJson(const std::string &s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(unsigned(uint8_t(s[i])));
  return o + "]";
}

std::string chatEntryJson(const std::string &token, double logprob) {
  return "{\"token\":" + sd::jsonQuote(token) + ",\"logprob\":" + sd::jsonNumber(logprob) +
         ",\"bytes\":" + bytesJson(token);
}

} // namespace

std::string logprobsJson(bool chat, const std::vector<LogprobEntry> &entries, size_t offset) {
  if (entries.empty()) return "null";
  if (chat) {
    std::string s = "{\"content\":[";
    for (size_t i = 0; i < entries.size(); ++i) {
      const LogprobEntry &e = entries[i];
      s += (i ? "," : "") + chatEntryJson(e.token, e.logprob) + ",\"top_logprobs\":[";
      for (size_t k = 0; k < e.top.size(); ++k) s += (k ? "," : "") + chatEntryJson(e.top[k].first, e.top[k].second) + "}";
      s += "]}";
    }
    return s + "]}";
  }
  std::string tokens, values, tops, offsets;
  for (size_t i = 0; i < entries.size(); ++i) {
    const LogprobEntry &e = entries[i];
    const char *sep = i ? "," : "";
    tokens += sep + sd::jsonQuote(e.token);
    values += sep + (e.known ? sd::jsonNumber(e.logprob) : std::string("null"));
    std::string top = "{";
    for (size_t k = 0; k < e.top.size(); ++k)
      top += (k ? "," : "") + sd::jsonQuote(e.top[k].first) + ":" + sd::jsonNumber(e.top[k].second);
    tops += sep + (e.known ? top + "}" : std::string("null"));
    offsets += sep + std::to_string(offset);
    offset += e.token.size();
  }
  return "{\"tokens\":[" + tokens + "],\"token_logprobs\":[" + values + "],\"top_logprobs\":[" + tops +
         "],\"text_offset\":[" + offsets + "]}";
}

namespace {

std::string base64(const uint8_t *data, size_t size) {
  static const char *digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < size; i += 3) {
    const uint32_t n = uint32_t(data[i]) << 16 | (i + 1 < size ? uint32_t(data[i + 1]) << 8 : 0) |
                       (i + 2 < size ? uint32_t(data[i + 2]) : 0);
    out += digits[n >> 18 & 63];
    out += digits[n >> 12 & 63];
    out += i + 1 < size ? digits[n >> 6 & 63] : '=';
    out += i + 2 < size ? digits[n & 63] : '=';
  }
  return out;
}

} // namespace

bool parseEmbeddingRequest(const std::string &body, EmbeddingRequest &out, Error &err) {
  out = EmbeddingRequest();
  auto doc = sd::parseJson(body, "the request body");
  if (!doc.isOk() || doc.value().type != Json::Type::Object) {
    err.status = 400;
    err.message = doc.isOk() ? "the request body must be a JSON object" : doc.status().message();
    return false;
  }
  for (const auto &[key, v] : doc.value().obj) {
    if (isNull(&v)) continue;
    if (key == "model") {
      if (v.type != Json::Type::String) return fieldError(err, key, "must be a string");
      out.model = v.str;
    } else if (key == "input") {
      if (!readPrompt(v, out.inputs, err, key)) return false;
    } else if (key == "encoding_format") {
      if (v.type != Json::Type::String || (v.str != "float" && v.str != "base64"))
        return fieldError(err, key, "must be \"float\" or \"base64\"");
      out.base64 = v.str == "base64";
    } else if (key == "dimensions") {
      if (!readInt(v, key, 1, 1 << 20, out.dimensions, err)) return false;
    } else if (key != "user") {
      return fieldError(err, key, "is not supported");
    }
  }
  if (out.inputs.empty()) return fieldError(err, "input", "is required");
  return true;
}

std::string embeddingsJson(const std::string &model, const std::vector<std::vector<float>> &vectors, bool base64Format,
                           int64_t promptTokens) {
  std::string s = "{\"object\":\"list\",\"data\":[";
  for (size_t i = 0; i < vectors.size(); ++i) {
    s += (i ? ",{" : "{") + std::string("\"object\":\"embedding\",\"index\":") + std::to_string(i) + ",\"embedding\":";
    if (base64Format) {
      s += "\"" + base64(reinterpret_cast<const uint8_t *>(vectors[i].data()), vectors[i].size() * sizeof(float)) + "\"";
    } else {
      s += "[";
      for (size_t k = 0; k < vectors[i].size(); ++k) s += (k ? "," : "") + sd::jsonNumber(double(vectors[i][k]));
      s += "]";
    }
    s += "}";
  }
  return s + "],\"model\":" + sd::jsonQuote(model) + ",\"usage\":{\"prompt_tokens\":" + std::to_string(promptTokens) +
         ",\"total_tokens\":" + std::to_string(promptTokens) + "}}";
}

std::string modelJson(const std::string &model, int64_t created) {
  return "{\"id\":" + sd::jsonQuote(model) + ",\"object\":\"model\",\"created\":" + std::to_string(created) +
         ",\"owned_by\":\"sdrun\"}";
}

} // namespace sdrun::openai
