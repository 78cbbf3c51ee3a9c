// sdrun generate: byte-level text in and out around the runtime's generator
// (sd/generate/generator.h).
#include "commands.h"
#include "flags.h"
#include "sd/generate/generator.h"
#include "sd/tokenize/tokenizer.h"
#include "sd/format/file_io.h"
#include "sd/format/json.h"
#include <algorithm>
#include <set>
#include <unistd.h>
#include <cstdio>
#include <functional>

namespace sdrun {
namespace {

const char *kGenerateUsage =
    "usage: sdrun generate PLAN.sdp --prompt TEXT... [--tokenizer DIR [--chat]] [--max-new-tokens N]\n"
    "                     [--temperature T] [--top-k K] [--top-p P] [--repetition-penalty R]\n"
    "                     [--stop TEXT]... [--stop-token ID]... [--seed S] [--adapter DIR] [--threads N]\n"
    "                     [--adapter-rank K] [--device cpu|cuda|auto] [--no-cuda-graphs] [--no-cpu-fallback] [--cpu-ops OP,...]\n"
    "\n"
    "Continues TEXT. Plans compiled with --kv-cache decode through their key/value\n"
    "cache (the prompt in prefill chunks, then one decode step per token) and\n"
    "continue several --prompt flags together (sdc compile --kv-batch rows at a\n"
    "time), each row at its own length; other plans re-run the infer entry's\n"
    "batch-1 window (the last `seq` tokens) for every token. Rows print in order,\n"
    "a line each: the first unfinished one streams its text, the others show\n"
    "theirs when it ends. Text is tokenized with --tokenizer (a Hugging Face\n"
    "tokenizer.json; generation stops at its EOS, and at the eos_token_id of a\n"
    "generation_config.json beside it, as transformers' generate does), else taken as bytes by a\n"
    "byte-level (256-token) model. --chat sends TEXT as a user turn rendered with\n"
    "the tokenizer's chat template and prints only the reply. Greedy when\n"
    "--temperature is 0 (the default is 0.8 with --top-k 40); --top-p keeps the\n"
    "fewest likeliest tokens holding that probability, --repetition-penalty divides\n"
    "the logits of tokens already seen (as transformers' generate does), and\n"
    "generation stops after any --stop text, and before any --stop-token id.\n"
    "--adapter-rank K runs a DyLoRA plan's adapter at its first K ranks.\n";

std::vector<std::string> stopTexts(const Flags &f) {
  auto it = f.values.find("--stop");
  std::vector<std::string> out;
  if (it != f.values.end())
    for (const std::string &s : it->second)
      if (!s.empty()) out.push_back(s);
  return out;
}

// Whether a stop text ends at or after byte `from` of `text` (it may have
// begun before); `end` is where the first such one ends.
bool stopAt(const std::string &text, size_t from, const std::vector<std::string> &stops, size_t &end) {
  end = std::string::npos;
  for (const std::string &s : stops) {
    size_t at = text.find(s, from >= s.size() ? from - s.size() + 1 : 0);
    if (at != std::string::npos) end = std::min(end, at + s.size());
  }
  return end != std::string::npos;
}

// One prompt being continued. The text shown is what decoding
// tokens[start:] adds to decoding the prompt's part of it (as transformers'
// TextStreamer prints), held back while it ends in an incomplete character.
struct Row {
  std::vector<int64_t> tokens;
  size_t start = 0;             // first token of the shown text (the reply's, with --chat)
  std::string base, printed;    // decoded prompt part; decoded text shown so far
  std::string shown;            // what this row has shown (prompt included unless --chat)
  bool done = false;
};

struct TextCodec {
  std::function<std::string(const std::vector<int64_t> &)> decode;
  std::set<int64_t> stopIds; // EOS ids and --stop-token: the row ends, the token unprinted
};

// --stop-token ids, each in [0, vocab).
bool stopTokens(const Flags &f, int64_t vocab, std::set<int64_t> &out) {
  std::vector<int64_t> ids;
  std::string err;
  if (!intFlags(f, "--stop-token", 0, vocab - 1, ids, err)) return fail(err), false;
  out.insert(ids.begin(), ids.end());
  return true;
}

// generation_config.json's eos_token_id (one id or a list: Llama 3 stops at
// <|eot_id|> and <|end_of_text|>) from the tokenizer's folder, when there.
bool generationConfigEos(const std::string &dir, std::set<int64_t> &out) {
  std::string path = dir + "/generation_config.json";
  if (::access(path.c_str(), F_OK) != 0) return true;
  auto text = sd::readWholeFile(path);
  if (!text.isOk()) return fail(text.status().message()), false;
  auto doc = sd::parseJson(text.value(), path);
  if (!doc.isOk()) return fail(doc.status().message()), false;
  const sd::Json *eos = doc.value().get("eos_token_id");
  if (!eos || eos->type == sd::Json::Type::Null) return true;
  std::vector<const sd::Json *> ids;
  if (eos->type == sd::Json::Type::Array)
    for (const sd::Json &e : eos->arr) ids.push_back(&e);
  else
    ids.push_back(eos);
  for (const sd::Json *e : ids) {
    if (!e->isInteger() || e->num < 0) return fail(path + ": eos_token_id must be a token id or a list of them"), false;
    out.insert(int64_t(e->num));
  }
  return true;
}

// The new token's text for `r`; true when the row is done (a stop text ended it).
bool appendToken(Row &r, int64_t token, const TextCodec &codec, const std::vector<std::string> &stops) {
  r.tokens.push_back(token);
  std::string now = codec.decode(std::vector<int64_t>(r.tokens.begin() + long(r.start), r.tokens.end()));
  size_t end;
  // A stop text in what was generated ends the output there (the stop text included).
  const bool stop = now.size() > r.base.size() && stopAt(now, std::max(r.base.size(), r.printed.size()), stops, end);
  if (stop) now.resize(std::max(end, r.printed.size()));
  const bool partial = now.size() >= 3 && now.compare(now.size() - 3, 3, "\xEF\xBF\xBD") == 0;
  if ((stop || !partial) && now.size() > r.printed.size() && now.compare(0, r.printed.size(), r.printed) == 0) {
    r.shown.append(now, r.printed.size(), std::string::npos);
    r.printed = now;
  }
  return stop;
}

// Continues every row by up to maxNew tokens, batchSize() rows at a time.
// Rows print in order, a line each. The first unfinished row streams its text
// as it comes; the rows after it keep theirs until it ends, then show what they
// have and stream on in turn. So the output is the same whether watched live or
// read at the end, and one prompt streams token by token.
int generateRows(sd::generate::Generator &gen, std::vector<Row> &rows, int64_t maxNew, const TextCodec &codec,
                 const std::vector<std::string> &stops) {
  size_t head = 0; // the row being shown
  auto show = [&] {
    while (head < rows.size()) {
      Row &r = rows[head];
      std::fwrite(r.shown.data(), 1, r.shown.size(), stdout);
      r.shown.clear();
      if (!r.done) break;
      std::fputc('\n', stdout);
      ++head;
    }
    std::fflush(stdout);
  };
  bool contextFull = false;
  for (size_t first = 0; first < rows.size(); first += size_t(gen.batchSize())) {
    const size_t last = std::min(rows.size(), first + size_t(gen.batchSize()));
    show(); // the prompt, when it is shown
    for (int64_t k = 0; k < maxNew; ++k) {
      std::vector<std::vector<int64_t>> batch;
      for (size_t i = first; i < last; ++i) batch.push_back(rows[i].done ? std::vector<int64_t>() : rows[i].tokens);
      if (std::all_of(batch.begin(), batch.end(), [](const auto &b) { return b.empty(); })) break;
      auto next = gen.nextBatch(batch);
      if (!next.isOk()) return fail(next.status().message());
      for (size_t i = first; i < last; ++i) {
        Row &r = rows[i];
        const int64_t t = next.value()[i - first];
        if (r.done) continue;
        if (codec.stopIds.count(t)) {
          r.done = true;
          continue;
        }
        r.done = appendToken(r, t, codec, stops);
        // A cache holds maxContext() positions: the token just sampled cannot be fed again.
        if (gen.cached() && int64_t(r.tokens.size()) >= gen.maxContext() && !r.done) {
          r.done = true;
          contextFull = contextFull || k + 1 < maxNew;
        }
      }
      show();
    }
    for (size_t i = first; i < last; ++i) rows[i].done = true; // --max-new-tokens reached
    show();
  }
  if (contextFull)
    std::fprintf(stderr, "sdrun: note: generation stopped at the plan's context of %lld tokens (sdc compile "
                         "--kv-cache)\n", (long long)gen.maxContext());
  return 0;
}

// Whether generation can start from these prompt tokens (the error printed when not).
bool checkPrompt(const sd::generate::Generator &gen, const std::vector<int64_t> &tokens) {
  if (tokens.empty()) return fail("--prompt gives no tokens"), false;
  if (gen.cached() ? int64_t(tokens.size()) > gen.maxContext() : int64_t(tokens.size()) >= gen.maxContext())
    return fail("the prompt is " + std::to_string(tokens.size()) + " tokens, the plan's context is " +
                std::to_string(gen.maxContext())),
           false;
  return true;
}

// Prompt ids from the tokenizer (with --chat, rendered as a user turn by its
// chat template), generation until --max-new-tokens or the tokenizer's EOS.
int generateWithTokenizer(const Flags &f, sd::generate::Generator &gen, const std::vector<std::string> &prompts,
                          int64_t maxNew) {
  auto loaded = sd::Tokenizer::load(flagValue(f, "--tokenizer"));
  if (!loaded.isOk()) return fail("--tokenizer: " + loaded.status().message());
  const sd::Tokenizer &tok = *loaded.value();
  TextCodec codec;
  if (tok.eosId() >= 0) codec.stopIds.insert(tok.eosId());
  if (!generationConfigEos(flagValue(f, "--tokenizer"), codec.stopIds) ||
      !stopTokens(f, gen.vocabSize(), codec.stopIds))
    return 1;
  codec.decode = [&](const std::vector<int64_t> &ids) {
    auto d = tok.decode(std::vector<int32_t>(ids.begin(), ids.end()), true);
    return d.isOk() ? d.value() : std::string();
  };
  const bool chat = hasFlag(f, "--chat");
  std::vector<Row> rows;
  for (const std::string &prompt : prompts) {
    sd::EncodeOptions eo;
    std::string text = prompt;
    if (chat) {
      auto rendered = tok.renderChat({{"user", prompt}}, true);
      if (!rendered.isOk()) return fail("--chat: " + rendered.status().message());
      text = rendered.value();
      eo.addSpecialTokens = false; // the template writes them, as apply_chat_template does
      eo.parseSpecial = true;
    }
    Row r;
    for (int32_t id : tok.encode(text, eo)) {
      if (id >= gen.vocabSize())
        return fail("--tokenizer: token " + std::to_string(id) + " is outside the model's " +
                    std::to_string(gen.vocabSize()) + " logits: the tokenizer does not belong to this model");
      r.tokens.push_back(id);
    }
    if (!checkPrompt(gen, r.tokens)) return 1;
    r.start = chat ? r.tokens.size() : 0;
    r.base = r.printed = chat ? std::string() : codec.decode(r.tokens);
    if (!chat) r.shown = prompt;
    rows.push_back(std::move(r));
  }
  return generateRows(gen, rows, maxNew, codec, stopTexts(f));
}

} // namespace

int generateCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  if (!parseFlags(args, {"--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--repetition-penalty", "--stop", "--stop-token",
                         "--seed", "--adapter", "--adapter-rank", "--threads", "--device",
                         "--tokenizer", "--cpu-ops"}, f,
                  err, {"--no-cuda-graphs", "--no-cpu-fallback", "--chat"})) {
    if (!f.help) return fail(err + " (see sdrun generate --help)");
  }
  if (f.help) return std::fputs(kGenerateUsage, stdout), 0;
  int64_t maxNew, topK, seed;
  sd::SessionOptions so;
  sd::generate::SamplingOptions sampling;
  double temperature;
  if (!intFlag(f, "--max-new-tokens", 64, 1, 1 << 20, maxNew, err) || !intFlag(f, "--top-k", 40, 0, 1 << 20, topK, err) ||
      !intFlag(f, "--seed", 0, 0, INT64_MAX, seed, err) || !sessionFlags(f, so, err) ||
      !numberFlag(f, "--temperature", 0.8, 0, 100, temperature, err) ||
      !numberFlag(f, "--top-p", 1.0, 1e-9, 1.0, sampling.topP, err) ||
      !numberFlag(f, "--repetition-penalty", 1.0, 1e-3, 1e3, sampling.repetitionPenalty, err))
    return fail(err);
  if (!hasFlag(f, "--prompt")) return fail("--prompt TEXT is required (see sdrun generate --help)");
  const std::vector<std::string> prompts = f.values.at("--prompt");
  auto loaded = sd::Plan::loadFile(f.plan);
  if (!loaded.isOk()) return fail(loaded.status().message());
  std::shared_ptr<const sd::Plan> plan(std::move(loaded.value()));
  if (auto cfg = sd::parseJson(plan->config.empty() ? "{}" : plan->config, "the plan's config");
      cfg.isOk() && cfg.value().get("classify"))
    return fail(f.plan + ": a classification plan (sdc compile --recipe classify): its infer entry gives class "
                "logits, not next-token logits; run it with sdrun infer");
  auto session = sd::Session::create(plan, so);
  if (!session.isOk()) return fail(session.status().message());
  sd::Session &s = *session.value();
  if (hasFlag(f, "--adapter"))
    if (auto st = loadAdapterFlag(f.plan, flagValue(f, "--adapter"), s); !st.isOk()) return fail(st.message());
  if (auto st = adapterRankFlag(f, s); !st.isOk()) return fail(st.message());
  sampling.temperature = temperature;
  sampling.topK = topK;
  sampling.seed = uint64_t(seed);
  auto gen = sd::generate::Generator::create(s, sampling);
  if (!gen.isOk()) return fail(f.plan + ": " + gen.status().message());
  if (hasFlag(f, "--tokenizer")) return generateWithTokenizer(f, *gen.value(), prompts, maxNew);
  if (hasFlag(f, "--chat")) return fail("--chat needs --tokenizer DIR (its chat template)");
  if (gen.value()->vocabSize() != 256)
    return fail(f.plan + ": the model has " + std::to_string(gen.value()->vocabSize()) +
                " logits per position, not 256 bytes: give --tokenizer DIR");
  TextCodec codec;
  if (!stopTokens(f, 256, codec.stopIds)) return 1;
  codec.decode = [](const std::vector<int64_t> &ids) { return std::string(ids.begin(), ids.end()); };
  std::vector<Row> rows;
  for (const std::string &prompt : prompts) {
    Row r;
    for (char c : prompt) r.tokens.push_back(int64_t(uint8_t(c)));
    if (r.tokens.empty()) r.tokens.push_back('\n');
    if (!checkPrompt(*gen.value(), r.tokens)) return 1;
    r.base = r.printed = codec.decode(r.tokens);
    r.shown = prompt;
    rows.push_back(std::move(r));
  }
  return generateRows(*gen.value(), rows, maxNew, codec, stopTexts(f));
}

} // namespace sdrun
