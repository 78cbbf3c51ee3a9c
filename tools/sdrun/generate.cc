// sdrun generate: byte-level text in and out around the runtime's generator
// (sd/generate/generator.h).
#include "commands.h"
#include "flags.h"
#include "sd/generate/generator.h"
#include "sd/tokenize/tokenizer.h"
#include <cstdio>

namespace sdrun {
namespace {

const char *kGenerateUsage =
    "usage: sdrun generate PLAN.sdp --prompt TEXT [--tokenizer DIR [--chat]] [--max-new-tokens N]\n"
    "                     [--temperature T] [--top-k K] [--top-p P] [--repetition-penalty R]\n"
    "                     [--stop TEXT]... [--seed S] [--adapter DIR] [--threads N]\n"
    "                     [--device cpu|cuda|auto]\n"
    "\n"
    "Continues TEXT, using the plan's infer entry with batch 1 (training plans get\n"
    "such a bucket by default). Text is tokenized with --tokenizer (a Hugging Face\n"
    "tokenizer.json; generation stops at its EOS), else taken as bytes by a\n"
    "byte-level (256-token) model. --chat sends TEXT as a user turn rendered with\n"
    "the tokenizer's chat template and prints only the reply. Greedy when\n"
    "--temperature is 0 (the default is 0.8 with --top-k 40); --top-p keeps the\n"
    "fewest likeliest tokens holding that probability, --repetition-penalty divides\n"
    "the logits of tokens already seen (as transformers' generate does), and\n"
    "generation stops after any --stop text. There is no KV cache\n"
    "yet: every new token re-runs the whole window (the last `seq` tokens), so the\n"
    "cost per token grows with the bucket length.\n";

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

// Prompt ids from the tokenizer, then one token at a time until --max-new-tokens
// or the tokenizer's EOS. The text printed is what decoding everything so far
// adds to decoding the prompt (as transformers' TextStreamer prints), held
// back while it ends in an incomplete character.
int generateWithTokenizer(const Flags &f, sd::generate::Generator &gen, const std::string &prompt, int64_t maxNew) {
  auto loaded = sd::Tokenizer::load(flagValue(f, "--tokenizer"));
  if (!loaded.isOk()) return fail("--tokenizer: " + loaded.status().message());
  const sd::Tokenizer &tok = *loaded.value();
  sd::EncodeOptions eo;
  std::string text = prompt;
  const bool chat = hasFlag(f, "--chat");
  if (chat) {
    auto rendered = tok.renderChat({{"user", prompt}}, true);
    if (!rendered.isOk()) return fail("--chat: " + rendered.status().message());
    text = rendered.value();
    eo.addSpecialTokens = false; // the template writes them, as apply_chat_template does
    eo.parseSpecial = true;
  }
  std::vector<int64_t> tokens;
  for (int32_t id : tok.encode(text, eo)) {
    if (id >= gen.vocabSize())
      return fail("--tokenizer: token " + std::to_string(id) + " is outside the model's " +
                  std::to_string(gen.vocabSize()) + " logits: the tokenizer does not belong to this model");
    tokens.push_back(id);
  }
  if (tokens.empty()) return fail("--prompt gives no tokens");
  if (int64_t(tokens.size()) >= gen.maxWindow())
    return fail("the prompt is " + std::to_string(tokens.size()) + " tokens, the plan's context is " +
                std::to_string(gen.maxWindow()));
  auto decodeFrom = [&](size_t start) {
    std::vector<int32_t> ids(tokens.begin() + long(start), tokens.end());
    auto d = tok.decode(ids, true);
    return d.isOk() ? d.value() : std::string();
  };
  const size_t promptEnd = tokens.size();
  const size_t start = chat ? promptEnd : 0;
  if (!chat) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::string base = chat ? std::string() : decodeFrom(0), printed = base;
  const std::vector<std::string> stops = stopTexts(f);
  for (int64_t k = 0; k < maxNew; ++k) {
    auto next = gen.next(tokens);
    if (!next.isOk()) return fail(next.status().message());
    if (next.value() == tok.eosId()) break;
    tokens.push_back(next.value());
    std::string now = decodeFrom(start);
    size_t end;
    // A stop text in what was generated ends the output there (the stop text included).
    const bool stop = now.size() > base.size() && stopAt(now, std::max(base.size(), printed.size()), stops, end);
    if (stop) now.resize(std::max(end, printed.size()));
    const bool partial = now.size() >= 3 && now.compare(now.size() - 3, 3, "\xEF\xBF\xBD") == 0;
    if ((stop || !partial) && now.size() > printed.size() && now.compare(0, printed.size(), printed) == 0) {
      std::fwrite(now.data() + printed.size(), 1, now.size() - printed.size(), stdout);
      std::fflush(stdout);
      printed = now;
    }
    if (stop) break;
  }
  std::fputc('\n', stdout);
  return 0;
}

} // namespace

int generateCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  if (!parseFlags(args, {"--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--repetition-penalty", "--stop",
                         "--seed", "--adapter", "--threads", "--device",
                         "--tokenizer"}, f,
                  err, {"--no-cuda-graphs", "--chat"})) {
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
  std::string prompt = flagValue(f, "--prompt");
  auto loaded = sd::Plan::loadFile(f.plan);
  if (!loaded.isOk()) return fail(loaded.status().message());
  std::shared_ptr<const sd::Plan> plan(std::move(loaded.value()));
  auto session = sd::Session::create(plan, so);
  if (!session.isOk()) return fail(session.status().message());
  sd::Session &s = *session.value();
  if (hasFlag(f, "--adapter"))
    if (auto st = loadAdapterFlag(f.plan, flagValue(f, "--adapter"), s); !st.isOk()) return fail(st.message());
  sampling.temperature = temperature;
  sampling.topK = topK;
  sampling.seed = uint64_t(seed);
  auto gen = sd::generate::Generator::create(s, sampling);
  if (!gen.isOk()) return fail(f.plan + ": " + gen.status().message());
  if (hasFlag(f, "--tokenizer")) return generateWithTokenizer(f, *gen.value(), prompt, maxNew);
  if (hasFlag(f, "--chat")) return fail("--chat needs --tokenizer DIR (its chat template)");
  if (gen.value()->vocabSize() != 256)
    return fail(f.plan + ": the model has " + std::to_string(gen.value()->vocabSize()) +
                " logits per position, not 256 bytes: give --tokenizer DIR");
  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  for (int64_t &t : tokens) t = int64_t(uint8_t(t));
  if (tokens.empty()) tokens.push_back('\n');
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  const std::vector<std::string> stops = stopTexts(f);
  std::string generated;
  for (int64_t k = 0; k < maxNew; ++k) {
    auto next = gen.value()->next(tokens);
    if (!next.isOk()) return fail(next.status().message());
    tokens.push_back(next.value());
    generated += char(next.value());
    std::fputc(int(next.value()), stdout);
    std::fflush(stdout);
    size_t end;
    if (stopAt(generated, generated.size() - 1, stops, end)) break;
  }
  std::fputc('\n', stdout);
  return 0;
}

} // namespace sdrun
