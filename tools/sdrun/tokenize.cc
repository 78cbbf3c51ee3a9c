// sdrun tokenize: text lines on stdin to one JSON list of token ids per line
// (or, with --decode, the reverse), with a Hugging Face tokenizer.json, so
// anyone can check our tokenizer against the `tokenizers` library.
#include "commands.h"
#include "flags.h"
#include "sd/format/json.h"
#include "sd/runtime/plan.h"
#include "sd/tokenize/tokenizer.h"
#include <cstdio>
#include <iostream>
#include <string>

namespace sdrun {
namespace {

const char *kTokenizeUsage =
    "usage: sdrun tokenize --tokenizer DIR|tokenizer.json|PLAN.sdp [--decode] [--no-special-tokens]\n"
    "                      [--parse-special] [--skip-special-tokens]\n"
    "\n"
    "Reads lines on stdin (a line is the bytes before each newline; invalid UTF-8\n"
    "becomes U+FFFD, as Python's errors=\"replace\" does) and prints each line's\n"
    "token ids as one JSON list.\n"
    "  --decode               read JSON lists of ids, print their text, one per line\n"
    "  --no-special-tokens    leave out the post-processor's BOS/EOS/CLS/SEP\n"
    "  --parse-special        match special tokens written in the text (by default\n"
    "                         they are plain text, so input cannot forge them)\n"
    "  --skip-special-tokens  --decode: drop special tokens from the text\n"
    "  --chat                 read {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": bool}\n"
    "                         lines (tools optional) and\n"
    "                         print each conversation rendered with the chat template of\n"
    "                         tokenizer_config.json, as a JSON string\n";

int renderChats(const sd::Tokenizer &tok) {
  std::string line;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    const std::string where = "stdin line " + std::to_string(n);
    auto json = sd::parseJson(line, where);
    if (!json.isOk()) return fail(json.status().message());
    const sd::Json *messages = json.value().get("messages"), *gen = json.value().get("add_generation_prompt");
    std::vector<sd::ChatMessage> chat;
    if (!messages) return fail(where + ": no 'messages'");
    if (auto st = sd::chatMessagesFromJson(*messages, chat); !st.isOk()) return fail(where + ": " + st.message());
    const sd::Json *tools = json.value().get("tools");
    auto text = tok.renderChat(chat, gen && gen->type == sd::Json::Type::Bool && gen->b, tools);
    if (!text.isOk()) return fail(where + ": " + text.status().message());
    std::string out = sd::jsonQuote(text.value()) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

int decodeLines(const sd::Tokenizer &tok, bool skipSpecial) {
  std::string line, text;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    auto json = sd::parseJson(line, "stdin line " + std::to_string(n));
    if (!json.isOk()) return fail(json.status().message());
    if (json.value().type != sd::Json::Type::Array) return fail("stdin line " + std::to_string(n) + ": not a JSON list of ids");
    std::vector<int32_t> ids;
    for (const sd::Json &v : json.value().arr) {
      if (!v.isInteger() || v.num < -2147483648.0 || v.num > 2147483647.0)
        return fail("stdin line " + std::to_string(n) + ": ids must be integers");
      ids.push_back(int32_t(v.num));
    }
    auto decoded = tok.decode(ids, skipSpecial);
    if (!decoded.isOk()) return fail("stdin line " + std::to_string(n) + ": " + decoded.status().message());
    text = decoded.value();
    text += '\n';
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  return 0;
}

} // namespace

int tokenizeCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  bool parsed = parseFlags(args, {"--tokenizer"}, f, err,
                           {"--decode", "--no-special-tokens", "--parse-special", "--skip-special-tokens", "--chat"});
  if (f.help) return std::fputs(kTokenizeUsage, stdout), 0;
  // The tokenizer may be given as --tokenizer or as the one positional argument.
  if (!parsed && !(f.plan.empty() && hasFlag(f, "--tokenizer"))) return fail(err + " (see sdrun tokenize --help)");
  std::string path = hasFlag(f, "--tokenizer") ? flagValue(f, "--tokenizer") : f.plan;
  if (path.empty()) return fail("--tokenizer DIR is required (see sdrun tokenize --help)");
  // A plan: the tokenizer it carries (sdc compile --tokenizer).
  sd::StatusOr<std::unique_ptr<sd::Tokenizer>> loaded = sd::Status::ok();
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".sdp") == 0) {
    auto plan = sd::Plan::loadFile(path);
    if (!plan.isOk()) return fail(plan.status().message());
    sd::TokenizerFiles files;
    if (!sd::TokenizerFiles::carried([&](const std::string &n) { return plan.value()->file(n); }, path, files))
      return fail(path + " carries no tokenizer (compile it with sdc compile --tokenizer DIR)");
    loaded = sd::Tokenizer::fromFiles(files);
  } else {
    loaded = sd::Tokenizer::load(path);
  }
  if (!loaded.isOk()) return fail(loaded.status().message());
  const sd::Tokenizer &tok = *loaded.value();
  std::ios::sync_with_stdio(false);
  if (hasFlag(f, "--decode")) return decodeLines(tok, hasFlag(f, "--skip-special-tokens"));
  if (hasFlag(f, "--chat")) return renderChats(tok);
  sd::EncodeOptions options;
  options.addSpecialTokens = !hasFlag(f, "--no-special-tokens");
  options.parseSpecial = hasFlag(f, "--parse-special");
  std::string line, out;
  while (std::getline(std::cin, line)) {
    out = "[";
    bool first = true;
    for (int32_t id : tok.encode(line, options)) {
      if (!first) out += ", ";
      out += std::to_string(id);
      first = false;
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

} // namespace sdrun
