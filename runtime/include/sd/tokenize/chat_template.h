// Chat templates: the Jinja subset that the chat templates of current model
// families use, rendered as transformers' apply_chat_template renders them
// (jinja2 with trim_blocks and lstrip_blocks): text, {{ }}, {% if/elif/else %},
// {% for %} (with loop.*, an if filter and else), {% set %} (namespace()
// attributes too), {% generation %}, whitespace control, the usual
// operators, filters, tests and string/dict methods, and raise_exception().
// A construct outside the subset is a parse error naming it and its line.
#pragma once
#include "sd/format/json.h"
#include "sd/format/status.h"
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sd {

struct ChatMessage {
  std::string role, content;
  // The message's other fields as a template reads them (an assistant
  // turn's tool_calls, with each call's arguments an object; a tool turn's
  // tool_call_id, name): an object, or null for none.
  Json fields;
  bool noContent = false; // content is None (an assistant turn of tool calls alone)
};

// "messages": [{"role": ..., "content": ...}, ...] as a data line or an
// OpenAI request has them: roles system (or developer), user, assistant and
// tool; content a string or text parts (joined by newlines); an assistant's
// tool_calls (arguments an object or its JSON text; content may then be
// null), a tool turn's tool_call_id, and name. Anything else is an error
// naming it (messages[k].field).
Status chatMessagesFromJson(const Json &messages, std::vector<ChatMessage> &out);

class ChatTemplate {
public:
  static StatusOr<std::unique_ptr<ChatTemplate>> parse(const std::string &source);
  ~ChatTemplate();
  // `strings`: further string variables (bos_token, eos_token, ...);
  // `tools`: the tools variable (OpenAI's list of functions), undefined when null.
  StatusOr<std::string> render(const std::vector<ChatMessage> &messages, bool addGenerationPrompt,
                               const std::map<std::string, std::string> &strings, const Json *tools = nullptr) const;

  struct Node;

private:
  ChatTemplate();
  std::vector<std::unique_ptr<Node>> body_;
};

} // namespace sd
