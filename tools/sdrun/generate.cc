// sdrun generate: byte-level text in and out around the runtime's generator
// (sd/generate/generator.h).
#include "commands.h"
#include "flags.h"
#include "generate_setup.h"
#include "sd/format/json.h"
#include "sd/generate/continue_rows.h"
#include <algorithm>
#include <cstdio>

namespace sdrun {
namespace {

const char *kGenerateUsage =
    "usage: sdrun generate PLAN.sdp --prompt TEXT... [--tokenizer DIR] [--chat [--chat-template FILE]] [--max-new-tokens N]\n"
    "                     [--temperature T] [--top-k K] [--top-p P] [--repetition-penalty R]\n"
    "                     [--stop TEXT]... [--stop-token ID]... [--json | --json-schema FILE] [--seed S] [--adapter DIR]\n"
    "                     [--speculate N [--speculate-always] [--draft PLAN]] [--threads N]\n"
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
    "generation_config.json beside it, as transformers' generate does), else with\n"
    "the tokenizer the plan carries (sdc compile --tokenizer), else taken as bytes by a\n"
    "byte-level (256-token) model. --chat sends TEXT as a user turn rendered with\n"
    "the tokenizer's chat template and prints only the reply. Greedy when\n"
    "--temperature is 0 (the default is 0.8 with --top-k 40); --top-p keeps the\n"
    "fewest likeliest tokens holding that probability, --repetition-penalty divides\n"
    "the logits of tokens already seen (as transformers' generate does), and\n"
    "generation stops after any --stop text, and before any --stop-token id.\n"
    "--adapter-rank K runs a DyLoRA plan's adapter at its first K ranks. Each row\n"
    "draws with its own seed (--seed, then the next).\n"
    "--speculate N guesses up to N tokens a step from each row's text (prompt lookup:\n"
    "what followed the last time its final tokens occurred) and checks them in the\n"
    "same call, for a plan compiled with --speculate K (default K; 0: off), in the\n"
    "steps where the guesses that held so far and the two calls' measured times say\n"
    "it pays (--speculate-always: every step that has guesses); the tokens are those\n"
    "drawn without it, and stderr says how many held. --draft PLAN guesses with a\n"
    "smaller model instead (its greedy tokens; a plan compiled with --kv-cache from a\n"
    "model of the same tokenizer, with as many --kv-batch rows and as long a cache).\n"
    "--json-schema FILE makes each row a JSON document that follows the JSON Schema in\n"
    "FILE (compact JSON, properties in the schema's order; a row ends when its\n"
    "document is whole), --json any JSON object: as sdrun serve's response_format.\n";

std::vector<std::string> stopTexts(const Flags &f) {
  auto it = f.values.find("--stop");
  std::vector<std::string> out;
  if (it != f.values.end())
    for (const std::string &s : it->second)
      if (!s.empty()) out.push_back(s);
  return out;
}

// Continues every row by up to maxNew tokens (sd/generate/continue_rows.h:
// batchSize() rows at a time, each drawing with its own sampler).
// Rows print in order, a line each. The first unfinished row streams its text
// as it comes; the rows after it keep theirs until it ends, then show what they
// have and stream on in turn. So the output is the same whether watched live or
// read at the end, and one prompt streams token by token.
// speculate > 0: each step guesses that many tokens a row by prompt lookup;
// the count of guessed and confirmed ones is printed at the end.
int generateRows(sd::generate::Generator &gen, std::vector<Row> &rows, int64_t maxNew, const TextCodec &codec,
                 const std::vector<std::string> &stops, std::vector<sd::generate::RowSampler> &samplers,
                 size_t speculate, bool speculateAlways, sd::generate::DraftModel *draft) {
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
  sd::generate::Speculator speculator(speculate, size_t(gen.batchSize()), speculateAlways, draft);
  sd::generate::RowsOptions options;
  options.maxNew = maxNew;
  options.stopIds = codec.stopIds;
  sd::generate::RowCallbacks callbacks;
  callbacks.tokens = [&](size_t i) -> const std::vector<int64_t> & { return rows[i].tokens; };
  callbacks.take = [&](size_t i, int64_t t) { return appendToken(rows[i], t, codec, stops); };
  callbacks.ended = [&](size_t i) { rows[i].done = true; };
  callbacks.stepped = show;
  show(); // the first prompt
  auto summary = sd::generate::continueRows(gen, rows.size(), options, samplers, speculator, callbacks);
  if (!summary.isOk()) return fail(summary.status().message());
  if (summary.value().contextFull)
    std::fprintf(stderr, "sdrun: note: generation stopped at the plan's context of %lld tokens (sdc compile "
                         "--kv-cache)\n", (long long)gen.contextRoom());
  if (speculate)
    std::fprintf(stderr, "sdrun: speculation: %llu of %llu guessed tokens confirmed; %.2f tokens a row and step\n",
                 (unsigned long long)speculator.confirmed(), (unsigned long long)speculator.guessed(),
                 summary.value().rowSteps ? double(summary.value().drawn) / double(summary.value().rowSteps) : 0.0);
  return 0;
}

// Whether generation can start from these prompt tokens (the error printed when not).
bool checkPrompt(const sd::generate::Generator &gen, const std::vector<int64_t> &tokens) {
  if (tokens.empty()) return fail("--prompt gives no tokens"), false;
  if (!gen.promptFits(tokens.size()))
    return fail("the prompt is " + std::to_string(tokens.size()) + " tokens, the plan's context is " +
                std::to_string(gen.contextRoom())),
           false;
  return true;
}

// Prompt ids from the tokenizer (with --chat, rendered as a user turn by its
// chat template), generation until --max-new-tokens or the tokenizer's EOS.
int generateWithTokenizer(const Flags &f, GenerationSetup &g, const std::vector<std::string> &prompts, int64_t maxNew,
                          std::vector<sd::generate::RowSampler> &samplers, size_t speculate, bool always) {
  const sd::Tokenizer &tok = *g.tokenizer;
  const TextCodec &codec = g.codec;
  sd::generate::Generator &gen = *g.gen;
  const bool chat = hasFlag(f, "--chat");
  std::vector<Row> rows;
  for (const std::string &prompt : prompts) {
    std::string text = prompt;
    if (chat) {
      sd::ChatMessage turn;
      turn.role = "user";
      turn.content = prompt;
      auto rendered = tok.renderChat({turn}, true);
      if (!rendered.isOk()) return fail("--chat: " + rendered.status().message());
      text = rendered.value();
    }
    auto ids = encodePrompt(g.tokenizer.get(), gen.vocabSize(), text, chat);
    if (!ids.isOk()) return fail(ids.status().message());
    Row r;
    r.tokens = ids.value();
    if (!checkPrompt(gen, r.tokens)) return 1;
    startRow(r, codec, chat ? 0 : SIZE_MAX); // with --chat only the reply shows
    if (!chat) r.shown = prompt;
    rows.push_back(std::move(r));
  }
  return generateRows(gen, rows, maxNew, codec, stopTexts(f), samplers, speculate, always, g.draft.get());
}

} // namespace

int generateCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  if (!parseFlags(args, {"--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--repetition-penalty", "--stop", "--stop-token",
                         "--seed", "--adapter", "--adapter-rank", "--threads", "--device",
                         "--tokenizer", "--chat-template", "--cpu-ops", "--json-schema", "--speculate", "--draft"}, f,
                  err, {"--no-cuda-graphs", "--no-cpu-fallback", "--chat", "--json", "--speculate-always"})) {
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
  sampling.temperature = temperature;
  sampling.topK = topK;
  sampling.seed = uint64_t(seed);
  std::shared_ptr<const sd::generate::JsonGrammar> grammar;
  if (!jsonFlags(f, grammar)) return 1;
  GenerationSetup g;
  if (int rc = openGeneration(f, so, sampling, false, g)) return rc;
  size_t speculate = 0;
  if (!speculateFlag(f, *g.gen, speculate, err)) return fail(err);
  if (int rc = openDraft(f, so, speculate, *g.gen, g)) return rc;
  // Each row draws with its own sampler: --seed, then the next seeds (and its constraint).
  std::shared_ptr<const sd::generate::JsonVocabulary> tokens;
  if (grammar) tokens = sd::generate::JsonVocabulary::make(tokenTable(g, g.gen->vocabSize()));
  std::vector<sd::generate::RowSampler> samplers;
  for (size_t i = 0; i < prompts.size(); ++i) {
    sd::generate::SamplingOptions o = sampling;
    o.seed = sampling.seed + i;
    samplers.emplace_back(o);
    if (grammar) samplers.back().constraint = std::make_shared<sd::generate::JsonConstraint>(grammar, tokens);
  }
  const bool always = hasFlag(f, "--speculate-always");
  if (g.tokenizer) return generateWithTokenizer(f, g, prompts, maxNew, samplers, speculate, always);
  if (hasFlag(f, "--chat"))
    return fail("--chat needs a tokenizer's chat template: --tokenizer DIR, or a plan compiled with one");
  std::vector<Row> rows;
  for (const std::string &prompt : prompts) {
    Row r;
    for (char c : prompt) r.tokens.push_back(int64_t(uint8_t(c)));
    if (r.tokens.empty()) r.tokens.push_back('\n');
    if (!checkPrompt(*g.gen, r.tokens)) return 1;
    startRow(r, g.codec);
    r.shown = prompt;
    rows.push_back(std::move(r));
  }
  return generateRows(*g.gen, rows, maxNew, g.codec, stopTexts(f), samplers, speculate, always, g.draft.get());
}

} // namespace sdrun
