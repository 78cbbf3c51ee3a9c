// JSON Lines training data.
#include "sd/train/dataset.h"
#include "sd/format/file_io.h"
#include "sd/format/json.h"
#include "sd/tokenize/tokenizer.h"
#include <cmath>
#include <fstream>
#include <numeric>
#include <tuple>

namespace sd {
namespace {

Status readIds(const Json &v, const char *key, int64_t vocab, bool isLabel, std::vector<int64_t> &out) {
  if (v.type != Json::Type::Array) return sdError("'", key, "' must be an array of integers");
  out.reserve(v.arr.size());
  for (size_t i = 0; i < v.arr.size(); ++i) {
    const Json &e = v.arr[i];
    if (!e.isInteger()) return sdError("'", key, "'[", i, "] is not an integer");
    int64_t id = int64_t(e.num);
    bool ok = (id >= 0 && id < vocab) || (isLabel && id == kIgnoreLabel);
    if (!ok) return sdError("'", key, "'[", i, "] = ", id, " is outside the vocabulary [0, ", vocab, ")");
    out.push_back(id);
  }
  return Status::ok();
}

// `s` as token ids appended to `ids`: the tokenizer's (as `eo` says), else
// its bytes, which only a byte-level (256-token) plan takes.
Status encodeText(const std::string &s, const EncodeOptions &eo, const DatasetOptions &opts, std::vector<int64_t> &ids) {
  if (!opts.tokenizer && opts.vocab != 256)
    return sdError("text needs --tokenizer DIR or a byte-level model (vocabulary 256, this plan has ", opts.vocab,
                   "); or give input_ids");
  size_t first = ids.size();
  if (opts.tokenizer) {
    for (int32_t id : opts.tokenizer->encode(s, eo)) ids.push_back(id);
  } else {
    for (unsigned char c : s) ids.push_back(int64_t(c));
  }
  for (size_t i = first; i < ids.size(); ++i)
    if (ids[i] >= opts.vocab)
      return sdError("token ", ids[i], " of the tokenizer is outside the plan's vocabulary [0, ", opts.vocab,
                     "): the tokenizer does not belong to this model");
  return Status::ok();
}

EncodeOptions withSpecials(bool specials) {
  EncodeOptions eo;
  eo.addSpecialTokens = specials;
  return eo;
}

// ids (and labels) of `text`, or of `prompt` + `completion` with the prompt's
// labels -100: the tokenizer's BOS (its post-processor) before, its EOS after
// (TRL's SFT does the same), or the bytes when there is no tokenizer.
Status tokenizeText(const std::string &first, const std::string *completion, const DatasetOptions &opts, Example &ex) {
  auto append = [&](const std::string &s, bool specials, bool trained) -> Status {
    std::vector<int64_t> ids;
    SD_RETURN_IF_ERROR(encodeText(s, withSpecials(specials), opts, ids));
    ex.ids.insert(ex.ids.end(), ids.begin(), ids.end());
    ex.labels.insert(ex.labels.end(), ids.size(), kIgnoreLabel);
    if (trained) std::copy(ids.begin(), ids.end(), ex.labels.end() - long(ids.size()));
    return Status::ok();
  };
  SD_RETURN_IF_ERROR(append(first, true, completion == nullptr));
  if (completion) SD_RETURN_IF_ERROR(append(*completion, false, true));
  const int32_t eos = opts.tokenizer ? opts.tokenizer->eosId() : -1;
  if (eos >= 0 && (ex.ids.empty() || ex.ids.back() != eos)) {
    if (eos >= opts.vocab) return sdError("the tokenizer's EOS ", eos, " is outside the plan's vocabulary");
    ex.ids.push_back(eos);
    ex.labels.push_back(eos);
  }
  return Status::ok();
}

// A conversation rendered with the tokenizer's chat template, the loss on the
// assistant turns only. Turn k's text is what rendering messages[0..k]
// adds to messages[0..k) with the generation prompt; each piece is tokenized
// on its own (as apply_chat_template tokenizes: no added BOS, the template's
// special tokens matched), so no token straddles a trained and an untrained span.
// `tools` (TRL's column: the functions the template shows) may be null.
Status tokenizeChat(const Json &messages, const Json *tools, const DatasetOptions &opts, Example &ex) {
  std::vector<ChatMessage> chat;
  SD_RETURN_IF_ERROR(chatMessagesFromJson(messages, chat));
  if (tools && tools->type != Json::Type::Array) return sdError("'tools' must be a list of functions");
  const Tokenizer &tok = *opts.tokenizer;
  auto full = tok.renderChat(chat, false, tools);
  if (!full.isOk()) return full.status();
  EncodeOptions eo;
  eo.addSpecialTokens = false;
  eo.parseSpecial = true;
  auto emit = [&](const std::string &text, bool trained) -> Status {
    size_t first = ex.ids.size();
    SD_RETURN_IF_ERROR(encodeText(text, eo, opts, ex.ids));
    for (size_t i = first; i < ex.ids.size(); ++i) ex.labels.push_back(trained ? ex.ids[i] : kIgnoreLabel);
    return Status::ok();
  };
  size_t pos = 0;
  bool anyAssistant = false;
  for (size_t k = 0; k < chat.size(); ++k) {
    if (chat[k].role != "assistant") continue;
    anyAssistant = true;
    std::vector<ChatMessage> before(chat.begin(), chat.begin() + long(k)), upTo(chat.begin(), chat.begin() + long(k) + 1);
    auto prefix = tok.renderChat(before, true, tools), whole = tok.renderChat(upTo, false, tools);
    if (!prefix.isOk()) return prefix.status();
    if (!whole.isOk()) return whole.status();
    const std::string &p = prefix.value(), &w = whole.value();
    if (p.size() < pos || w.compare(0, p.size(), p) != 0 || full.value().compare(0, w.size(), w) != 0)
      return sdError("the chat template does not render messages[", k, "] as an addition to the turns before it, so "
                     "the assistant's tokens cannot be told apart");
    SD_RETURN_IF_ERROR(emit(full.value().substr(pos, p.size() - pos), false));
    SD_RETURN_IF_ERROR(emit(w.substr(p.size()), true));
    pos = w.size();
  }
  if (!anyAssistant) return sdError("the conversation has no assistant turn to train on");
  return emit(full.value().substr(pos), false);
}

uint64_t splitMix(uint64_t &s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Refuses, or with --truncate cuts, a sequence (and its labels, if any)
// longer than the plan's largest bucket; `what` names it ("sequence").
Status fitLength(std::vector<int64_t> &ids, std::vector<int64_t> &labels, const std::string &where,
                 const std::string &what, const DatasetOptions &opts) {
  if (int64_t(ids.size()) <= opts.maxLength) return Status::ok();
  if (!opts.truncate)
    return sdError(where, ": ", what, " of ", ids.size(), " tokens is longer than the plan's largest bucket (",
                   opts.maxLength, "); use --truncate or compile a longer bucket");
  ids.resize(size_t(opts.maxLength));
  if (!labels.empty()) labels.resize(size_t(opts.maxLength));
  return Status::ok();
}
Status fitLength(Example &ex, const std::string &where, const DatasetOptions &opts) {
  return fitLength(ex.ids, ex.labels, where, "sequence", opts);
}

// A classification line: "text" or "input_ids", and the class "label".
StatusOr<Example> parseClassifyLine(const Json &j, const std::string &where, const DatasetOptions &opts) {
  for (const char *other : {"prompt", "completion", "messages", "labels"})
    if (j.get(other))
      return sdError(where, ": '", other, "' is not a field of classification data: a line has 'text' (or 'input_ids') ",
                     "and 'label'");
  const Json *label = j.get("label"), *text = j.get("text"), *ids = j.get("input_ids");
  if (!label) return sdError(where, ": a classification line needs 'label', an integer class in [0, ", opts.numLabels, ")");
  if (!label->isInteger()) return sdError(where, ": 'label' must be an integer class in [0, ", opts.numLabels, ")");
  if (label->num < 0 || label->num >= double(opts.numLabels))
    return sdError(where, ": 'label' = ", int64_t(label->num), " is outside the plan's classes [0, ", opts.numLabels, ")");
  if (!text == !ids) return sdError(where, ": a classification line needs 'text' or 'input_ids' (one of them)");
  Example ex;
  ex.label = int64_t(label->num);
  if (ids) {
    SD_RETURN_IF_ERROR(readIds(*ids, "input_ids", opts.vocab, false, ex.ids).withContext(where + ": "));
  } else {
    if (text->type != Json::Type::String) return sdError(where, ": 'text' must be a string");
    SD_RETURN_IF_ERROR(encodeText(text->str, withSpecials(true), opts, ex.ids).withContext(where + ": "));
  }
  if (ex.ids.empty()) return sdError(where, ": the example has no tokens");
  SD_RETURN_IF_ERROR(fitLength(ex, where, opts));
  return ex;
}

// The prompt's tokens labelled -100, then the completion's labelled as themselves.
void appendCompletion(const std::vector<int64_t> &prompt, const std::vector<int64_t> &completion,
                      std::vector<int64_t> &ids, std::vector<int64_t> &labels) {
  ids = prompt;
  ids.insert(ids.end(), completion.begin(), completion.end());
  labels.assign(prompt.size(), kIgnoreLabel);
  labels.insert(labels.end(), completion.begin(), completion.end());
}

// A preference line: `prompt`, `chosen` and `rejected` texts (each completion
// tokenized after the prompt as a prompt/completion line is), or TRL's
// tokenized `prompt_ids`, `chosen_ids` and `rejected_ids`.
StatusOr<Example> parsePairLine(const Json &j, const std::string &where, const DatasetOptions &opts) {
  for (const char *other : {"input_ids", "labels", "text", "completion", "completion_ids", "messages", "label"})
    if (j.get(other))
      return sdError(where, ": '", other, "' is not a field of preference data: a line has 'prompt', 'chosen' and ",
                     "'rejected' (or 'prompt_ids', 'chosen_ids' and 'rejected_ids')");
  Example ex;
  const char *texts[] = {"prompt", "chosen", "rejected"}, *tokens[] = {"prompt_ids", "chosen_ids", "rejected_ids"};
  const bool tokenized = j.get("prompt_ids") || j.get("chosen_ids") || j.get("rejected_ids");
  for (int k = 0; k < 3; ++k)
    if (!j.get(tokenized ? tokens[k] : texts[k]))
      return sdError(where, ": a preference line needs '", tokenized ? tokens[k] : texts[k], "' (it has ",
                     tokenized ? "'prompt_ids', 'chosen_ids', 'rejected_ids'" : "'prompt', 'chosen', 'rejected'",
                     " together)");
  if (tokenized) {
    if (j.get("prompt"))
      return sdError(where, ": a line has 'prompt' texts or '..._ids' tokens, not both");
    std::vector<int64_t> parts[3];
    for (int k = 0; k < 3; ++k)
      SD_RETURN_IF_ERROR(readIds(*j.get(tokens[k]), tokens[k], opts.vocab, false, parts[k]).withContext(where + ": "));
    appendCompletion(parts[0], parts[1], ex.ids, ex.labels);
    appendCompletion(parts[0], parts[2], ex.rejectedIds, ex.rejectedLabels);
  } else {
    for (const char *k : texts)
      if (j.get(k)->type != Json::Type::String)
        return sdError(where, ": '", k, "' must be a string");
    Example rejected;
    SD_RETURN_IF_ERROR(tokenizeText(j.get("prompt")->str, &j.get("chosen")->str, opts, ex).withContext(where + ": "));
    SD_RETURN_IF_ERROR(
        tokenizeText(j.get("prompt")->str, &j.get("rejected")->str, opts, rejected).withContext(where + ": "));
    ex.rejectedIds = std::move(rejected.ids);
    ex.rejectedLabels = std::move(rejected.labels);
  }
  for (auto [ids, labels, which] :
       {std::tuple{&ex.ids, &ex.labels, "chosen"}, {&ex.rejectedIds, &ex.rejectedLabels, "rejected"}}) {
    SD_RETURN_IF_ERROR(fitLength(*ids, *labels, where, std::string("the prompt and ") + which + " completion", opts));
    // Labels shift inside the plan: the first token is never predicted.
    if (labels->size() < 2 ||
        std::all_of(labels->begin() + 1, labels->end(), [](int64_t l) { return l == kIgnoreLabel; }))
      return sdError(where, ": the ", which, " completion has no tokens",
                     opts.truncate ? " left after --truncate (the prompt fills the plan's length)" : "");
  }
  return ex;
}

// An unpaired preference line (KTO): `prompt` and `completion` texts, or
// TRL's tokenized `prompt_ids` and `completion_ids`, and a boolean `label`
// (true: desirable).
StatusOr<Example> parseUnpairedLine(const Json &j, const std::string &where, const DatasetOptions &opts) {
  for (const char *other : {"input_ids", "labels", "text", "messages", "chosen", "rejected", "chosen_ids", "rejected_ids"})
    if (j.get(other))
      return sdError(where, ": '", other, "' is not a field of unpaired preference data: a line has 'prompt', ",
                     "'completion' and 'label' (or 'prompt_ids', 'completion_ids' and 'label')");
  const Json *label = j.get("label");
  if (!label) return sdError(where, ": an unpaired preference line needs 'label': true (desirable) or false");
  if (label->type != Json::Type::Bool) return sdError(where, ": 'label' must be true (desirable) or false");
  Example ex;
  ex.label = label->b ? 1 : 0;
  const bool tokenized = j.get("prompt_ids") || j.get("completion_ids");
  const char *fields[] = {tokenized ? "prompt_ids" : "prompt", tokenized ? "completion_ids" : "completion"};
  for (const char *k : fields)
    if (!j.get(k))
      return sdError(where, ": an unpaired preference line needs '", k, "' (it has ",
                     tokenized ? "'prompt_ids', 'completion_ids'" : "'prompt', 'completion'", " and 'label' together)");
  if (tokenized) {
    if (j.get("prompt") || j.get("completion"))
      return sdError(where, ": a line has 'prompt'/'completion' texts or '..._ids' tokens, not both");
    std::vector<int64_t> prompt, completion;
    SD_RETURN_IF_ERROR(readIds(*j.get("prompt_ids"), "prompt_ids", opts.vocab, false, prompt).withContext(where + ": "));
    SD_RETURN_IF_ERROR(
        readIds(*j.get("completion_ids"), "completion_ids", opts.vocab, false, completion).withContext(where + ": "));
    appendCompletion(prompt, completion, ex.ids, ex.labels);
  } else {
    for (const char *k : fields)
      if (j.get(k)->type != Json::Type::String) return sdError(where, ": '", k, "' must be a string");
    SD_RETURN_IF_ERROR(
        tokenizeText(j.get("prompt")->str, &j.get("completion")->str, opts, ex).withContext(where + ": "));
  }
  // The completion starts at the first counted label; the KL rows put it after another example's prompt.
  ex.promptLength = int64_t(std::find_if(ex.labels.begin(), ex.labels.end(), [](int64_t l) { return l != kIgnoreLabel; }) -
                            ex.labels.begin());
  SD_RETURN_IF_ERROR(fitLength(ex.ids, ex.labels, where, "the prompt and completion", opts));
  ex.promptLength = std::min(ex.promptLength, int64_t(ex.ids.size()));
  // Labels shift inside the plan: the first token is never predicted.
  if (ex.labels.size() < 2 ||
      std::all_of(ex.labels.begin() + 1, ex.labels.end(), [](int64_t l) { return l == kIgnoreLabel; }))
    return sdError(where, ": the completion has no tokens",
                   opts.truncate ? " left after --truncate (the prompt fills the plan's length)" : "");
  return ex;
}

// A GRPO line: one prompt's group of scored completions, `prompt` with
// `completions` (texts) or TRL's tokenized `prompt_ids` with
// `completion_ids` (lists of ids), and `rewards`, a number per completion.
StatusOr<Example> parseGroupLine(const Json &j, const std::string &where, const DatasetOptions &opts) {
  for (const char *other : {"input_ids", "labels", "text", "messages", "chosen", "rejected", "chosen_ids",
                            "rejected_ids", "completion", "label"})
    if (j.get(other))
      return sdError(where, ": '", other, "' is not a field of GRPO data: a line has 'prompt', 'completions' and ",
                     "'rewards' (or 'prompt_ids', 'completion_ids' and 'rewards')");
  const bool tokenized = j.get("prompt_ids") || j.get("completion_ids");
  const char *fields[] = {tokenized ? "prompt_ids" : "prompt", tokenized ? "completion_ids" : "completions", "rewards"};
  if (tokenized && (j.get("prompt") || j.get("completions")))
    return sdError(where, ": a line has 'prompt'/'completions' texts or '..._ids' tokens, not both");
  for (const char *k : fields)
    if (!j.get(k))
      return sdError(where, ": a GRPO line needs '", k, "' (a line has ",
                     tokenized ? "'prompt_ids', 'completion_ids'" : "'prompt', 'completions'", " and 'rewards' together)");
  const Json &completions = *j.get(fields[1]), &rewards = *j.get("rewards");
  const size_t n = size_t(opts.groupSize);
  if (completions.type != Json::Type::Array || completions.arr.size() != n)
    return sdError(where, ": '", fields[1], "' must list the plan's --num-generations ", n, " completions",
                   completions.type == Json::Type::Array ? ", it has " + std::to_string(completions.arr.size()) : "");
  if (rewards.type != Json::Type::Array || rewards.arr.size() != n)
    return sdError(where, ": 'rewards' must list ", n, " numbers, one per completion",
                   rewards.type == Json::Type::Array ? ", it has " + std::to_string(rewards.arr.size()) : "");
  const Json *logps = j.get("completion_logps");
  if (opts.samplingLogProbs && !logps)
    return sdError(where, ": the plan takes the sampling policy's log-probabilities (sdc compile --sampling-log-probs): ",
                   "a line needs 'completion_logps', a list per completion");
  if (!opts.samplingLogProbs && logps)
    return sdError(where, ": 'completion_logps' is for plans compiled with --sampling-log-probs; this plan takes the ",
                   "step's own policy as the sampling one");
  if (logps && !tokenized)
    return sdError(where, ": 'completion_logps' go with 'completion_ids' (the tokens they belong to), not with text");
  if (logps && (logps->type != Json::Type::Array || logps->arr.size() != n))
    return sdError(where, ": 'completion_logps' must list ", n, " lists, one per completion");
  Example ex;
  std::vector<int64_t> prompt;
  if (tokenized) {
    SD_RETURN_IF_ERROR(readIds(*j.get("prompt_ids"), "prompt_ids", opts.vocab, false, prompt).withContext(where + ": "));
  } else if (j.get("prompt")->type != Json::Type::String) {
    return sdError(where, ": 'prompt' must be a string");
  }
  for (size_t k = 0; k < n; ++k) {
    const Json &r = rewards.arr[k];
    if (r.type != Json::Type::Number || !std::isfinite(float(r.num)))
      return sdError(where, ": 'rewards'[", k, "] is not a finite number");
    ex.rewards.push_back(float(r.num));
    const std::string which = std::string(fields[1]) + "[" + std::to_string(k) + "]";
    Example one;
    if (tokenized) {
      std::vector<int64_t> completion;
      SD_RETURN_IF_ERROR(
          readIds(completions.arr[k], which.c_str(), opts.vocab, false, completion).withContext(where + ": "));
      appendCompletion(prompt, completion, one.ids, one.labels);
    } else {
      if (completions.arr[k].type != Json::Type::String) return sdError(where, ": '", which, "' must be a string");
      SD_RETURN_IF_ERROR(
          tokenizeText(j.get("prompt")->str, &completions.arr[k].str, opts, one).withContext(where + ": "));
    }
    if (logps) { // aligned with the row: 0 on the prompt, then each completion token's
      const Json &l = logps->arr[k];
      const size_t completion = one.ids.size() - prompt.size();
      if (l.type != Json::Type::Array || l.arr.size() != completion)
        return sdError(where, ": 'completion_logps'[", k, "] must hold ", completion, " numbers, one per token of ",
                       which);
      std::vector<float> row(prompt.size(), 0.0f);
      for (size_t t = 0; t < completion; ++t) {
        const Json &x = l.arr[t];
        if (x.type != Json::Type::Number || !std::isfinite(float(x.num)) || x.num > 0)
          return sdError(where, ": 'completion_logps'[", k, "][", t, "] is not a log-probability (a finite number <= 0)");
        row.push_back(float(x.num));
      }
      ex.groupLogProbs.push_back(std::move(row));
    }
    SD_RETURN_IF_ERROR(fitLength(one.ids, one.labels, where, "the prompt and " + which, opts));
    if (logps) ex.groupLogProbs.back().resize(one.ids.size());
    // Labels shift inside the plan: the first token is never predicted.
    if (one.labels.size() < 2 ||
        std::all_of(one.labels.begin() + 1, one.labels.end(), [](int64_t l) { return l == kIgnoreLabel; }))
      return sdError(where, ": ", which, " has no tokens",
                     opts.truncate ? " left after --truncate (the prompt fills the plan's length)" : "");
    ex.groupIds.push_back(std::move(one.ids));
    ex.groupLabels.push_back(std::move(one.labels));
  }
  return ex;
}

// A prompt to sample a group from (sdrun train --reward-cmd): `prompt` text
// (the tokenizer's specials from its post-processor, no EOS) or `prompt_ids`.
StatusOr<Example> parsePromptLine(const Json &j, const std::string &where, const DatasetOptions &opts) {
  for (const auto &[key, v] : j.obj)
    if (key != "prompt" && key != "prompt_ids")
      return sdError(where, ": '", key, "' is not a field of a prompt line: with --reward-cmd each line is a prompt, ",
                     "{\"prompt\": TEXT} or {\"prompt_ids\": [...]}, whose completions the plan samples");
  const Json *text = j.get("prompt"), *ids = j.get("prompt_ids");
  if (!text == !ids) return sdError(where, ": a prompt line needs 'prompt' or 'prompt_ids' (one of them)");
  Example ex;
  if (ids) {
    SD_RETURN_IF_ERROR(readIds(*ids, "prompt_ids", opts.vocab, false, ex.ids).withContext(where + ": "));
  } else {
    if (text->type != Json::Type::String) return sdError(where, ": 'prompt' must be a string");
    SD_RETURN_IF_ERROR(encodeText(text->str, withSpecials(true), opts, ex.ids).withContext(where + ": "));
  }
  if (ex.ids.empty()) return sdError(where, ": the prompt has no tokens");
  if (int64_t(ex.ids.size()) >= opts.maxLength) { // a completion needs at least one token of the row
    if (!opts.truncate)
      return sdError(where, ": the prompt of ", ex.ids.size(), " tokens leaves no room for a completion in the plan's ",
                     opts.maxLength, "-token rows; use --truncate or compile longer rows");
    ex.ids.resize(size_t(opts.maxLength - 1));
  }
  ex.labels = ex.ids;
  return ex;
}

} // namespace

StatusOr<Example> parseDataLine(const std::string &line, const std::string &where, const DatasetOptions &opts) {
  auto doc = parseJson(line, where);
  if (!doc.isOk()) return doc.status();
  const Json &j = doc.value();
  if (j.type != Json::Type::Object) return sdError(where, ": expected a JSON object");
  if (opts.numLabels > 0) return parseClassifyLine(j, where, opts);
  if (opts.unpaired) return parseUnpairedLine(j, where, opts);
  if (opts.promptsOnly) return parsePromptLine(j, where, opts);
  if (opts.groupSize) return parseGroupLine(j, where, opts);
  if (opts.pairs) return parsePairLine(j, where, opts);
  for (const char *pairField : {"chosen", "rejected", "chosen_ids", "rejected_ids"})
    if (j.get(pairField))
      return sdError(where, ": '", pairField, "' belongs to preference pairs, for plans compiled with sdc compile ",
                     "--recipe dpo, simpo or orpo; this plan trains on single sequences");
  for (const char *groupField : {"completions", "rewards"})
    if (j.get(groupField))
      return sdError(where, ": '", groupField, "' belongs to groups of scored completions, for plans compiled with ",
                     "sdc compile --recipe grpo; this plan trains on single sequences");
  if (j.get("label"))
    return sdError(where, ": 'label' is for classification plans (sdc compile --recipe classify) and unpaired ",
                   "preference plans (--recipe kto); this plan trains a language model");
  Example ex;
  if (j.get("tools") && !j.get("messages"))
    return sdError(where, ": 'tools' go with 'messages' (the chat template shows them beside the conversation)");
  const Json *ids = j.get("input_ids"), *labels = j.get("labels"), *text = j.get("text");
  const Json *prompt = j.get("prompt"), *completion = j.get("completion");
  if (ids) {
    if (Status s = readIds(*ids, "input_ids", opts.vocab, false, ex.ids); !s.isOk()) return s.withContext(where + ": ");
  } else if (text || prompt || completion) {
    if (text && (prompt || completion)) return sdError(where, ": a line has 'text' or 'prompt'/'completion', not both");
    if (!text && !(prompt && completion)) return sdError(where, ": 'prompt' and 'completion' come together");
    for (const Json *field : {text, prompt, completion})
      if (field && field->type != Json::Type::String)
        return sdError(where, ": '", field == text ? "text" : field == prompt ? "prompt" : "completion",
                       "' must be a string");
    SD_RETURN_IF_ERROR(tokenizeText(text ? text->str : prompt->str, text ? nullptr : &completion->str, opts, ex)
                           .withContext(where + ": "));
    if (labels) return sdError(where, ": 'labels' go with 'input_ids', not with text");
  } else if (const Json *messages = j.get("messages")) {
    if (!opts.tokenizer) return sdError(where, ": 'messages' lines need --tokenizer DIR with a chat template");
    if (labels) return sdError(where, ": 'labels' go with 'input_ids', not with messages");
    SD_RETURN_IF_ERROR(tokenizeChat(*messages, j.get("tools"), opts, ex).withContext(where + ": "));
  } else {
    return sdError(where, ": a line needs 'input_ids', 'text' or 'prompt' and 'completion'");
  }
  if (labels) {
    if (Status s = readIds(*labels, "labels", opts.vocab, true, ex.labels); !s.isOk()) return s.withContext(where + ": ");
    if (ex.labels.size() != ex.ids.size())
      return sdError(where, ": 'labels' has ", ex.labels.size(), " entries but the sequence has ", ex.ids.size());
  } else if (ex.labels.empty()) {
    ex.labels = ex.ids;
  }
  if (ex.ids.size() < 2) return sdError(where, ": a sequence needs at least 2 tokens to train on");
  SD_RETURN_IF_ERROR(fitLength(ex, where, opts));
  return ex;
}

StatusOr<std::vector<Example>> loadJsonl(const std::string &path, const DatasetOptions &opts) {
  SD_RETURN_IF_ERROR(requireRegularFile(path)); // not a FIFO or /dev/zero: those never end
  std::ifstream in(path, std::ios::binary);
  if (!in) return sdError(path, ": cannot open");
  std::vector<Example> out;
  std::string line;
  for (size_t lineNo = 1; std::getline(in, line); ++lineNo) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string where = path + ":" + std::to_string(lineNo);
    auto ex = parseDataLine(line, where, opts);
    if (!ex.isOk()) return ex.status();
    out.push_back(std::move(ex.value()));
  }
  if (in.bad()) return sdError(path, ": read error");
  if (out.empty()) return sdError(path, ": no examples");
  return out;
}

std::vector<size_t> shuffledOrder(size_t n, uint64_t seed) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  uint64_t s = seed;
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[size_t(splitMix(s) % i)]);
  return order;
}

} // namespace sd
