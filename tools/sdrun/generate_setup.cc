// Opening a plan for generation (shared by sdrun generate and sdrun serve).
#include "generate_setup.h"
#include "commands.h"
#include "sd/format/file_io.h"
#include "sd/format/json.h"

namespace sdrun {
namespace {

// The tokenizer's files: --tokenizer's, else those the plan carries (sdc
// compile --tokenizer). False when there are neither.
sd::StatusOr<bool> tokenizerSource(const Flags &f, const sd::Plan &plan, sd::TokenizerFiles &files) {
  if (!hasFlag(f, "--tokenizer"))
    return sd::TokenizerFiles::carried([&](const std::string &n) { return plan.file(n); }, f.plan, files);
  auto read = sd::TokenizerFiles::read(flagValue(f, "--tokenizer"));
  if (!read.isOk()) return read.status().withContext("--tokenizer: ");
  files = std::move(read.value());
  return true;
}

} // namespace

sd::StatusOr<std::unique_ptr<sd::Tokenizer>> openTokenizer(const Flags &f, const sd::Plan &plan, std::string &genConfig,
                                                           std::string &genConfigName) {
  sd::TokenizerFiles files;
  auto found = tokenizerSource(f, plan, files);
  if (!found.isOk()) return found.status();
  genConfig = files.generationConfig;
  genConfigName = files.generationConfigName;
  if (!found.value()) {
    if (hasFlag(f, "--chat-template")) return sd::sdError("--chat-template needs a tokenizer (--tokenizer DIR)");
    return std::unique_ptr<sd::Tokenizer>();
  }
  if (hasFlag(f, "--chat-template")) { // a template of one's own, as vLLM's --chat-template takes it
    auto text = sd::readWholeFile(flagValue(f, "--chat-template"));
    if (!text.isOk()) return text.status().withContext("--chat-template: ");
    files.chatTemplate = text.value();
    files.chatTemplateName = flagValue(f, "--chat-template");
  }
  auto tok = sd::Tokenizer::fromFiles(files);
  if (!tok.isOk()) return tok.status().withContext(hasFlag(f, "--tokenizer") ? "--tokenizer: " : "");
  return std::move(tok.value());
}

bool isClassifier(const sd::Plan &plan) {
  auto cfg = sd::parseJson(plan.config.empty() ? "{}" : plan.config, "the plan's config");
  return cfg.isOk() && cfg.value().get("classify");
}

sd::StatusOr<std::unique_ptr<sd::Session>> openSession(const Flags &f, const std::shared_ptr<const sd::Plan> &plan,
                                                       const std::string &adapter, const sd::SessionOptions &so) {
  auto session = sd::Session::create(plan, so);
  if (!session.isOk()) return session.status();
  if (!adapter.empty()) SD_RETURN_IF_ERROR(loadAdapterFlag(f.plan, adapter, *session.value()));
  SD_RETURN_IF_ERROR(adapterRankFlag(f, *session.value()));
  return std::move(session.value());
}

int openGeneration(const Flags &f, const sd::SessionOptions &so, const sd::generate::SamplingOptions &sampling,
                   bool validUtf8, GenerationSetup &out) {
  if (!out.plan) {
    auto loaded = sd::Plan::loadFile(f.plan);
    if (!loaded.isOk()) return fail(loaded.status().message());
    out.plan = std::move(loaded.value());
  }
  if (isClassifier(*out.plan))
    return fail(f.plan + ": a classification plan (sdc compile --recipe classify): its infer entry gives class "
                "logits, not next-token logits; run it with sdrun infer");
  auto session = openSession(f, out.plan, flagValue(f, "--adapter"), so);
  if (!session.isOk()) return fail(session.status().message());
  out.session = std::move(session.value());
  auto gen = sd::generate::Generator::create(*out.session, sampling);
  if (!gen.isOk()) return fail(f.plan + ": " + gen.status().message());
  out.gen = std::move(gen.value());
  const int64_t vocab = out.gen->vocabSize();
  std::vector<int64_t> stopIds;
  std::string err;
  if (!intFlags(f, "--stop-token", 0, vocab - 1, stopIds, err)) return fail(err);
  out.codec.stopIds.insert(stopIds.begin(), stopIds.end());
  std::string genConfig, genConfigName;
  auto tok = openTokenizer(f, *out.plan, genConfig, genConfigName);
  if (!tok.isOk()) return fail(tok.status().message());
  if (!tok.value()) { // a byte-level model: its tokens are bytes
    if (vocab != 256)
      return fail(f.plan + ": the model has " + std::to_string(vocab) +
                  " logits per position, not 256 bytes, and the plan carries no tokenizer: give --tokenizer DIR");
    out.codec.decode = [validUtf8](const std::vector<int64_t> &ids) {
      std::string bytes(ids.begin(), ids.end());
      return validUtf8 ? sd::toValidUtf8(bytes) : bytes;
    };
    out.codec.piece = [](int64_t id) { return sd::toValidUtf8(std::string(1, char(uint8_t(id)))); };
    return 0;
  }
  out.tokenizer = std::move(tok.value());
  if (out.tokenizer->eosId() >= 0) out.codec.stopIds.insert(out.tokenizer->eosId());
  if (!genConfigName.empty())
    if (auto st = generationConfigEos(genConfig, genConfigName, out.codec.stopIds); !st.isOk()) return fail(st.message());
  const sd::Tokenizer *t = out.tokenizer.get();
  out.codec.decode = [t](const std::vector<int64_t> &ids) {
    auto d = t->decode(std::vector<int32_t>(ids.begin(), ids.end()), true);
    return d.isOk() ? d.value() : std::string();
  };
  out.codec.piece = [t](int64_t id) {
    auto d = t->decode({int32_t(id)}, false);
    return d.isOk() ? sd::toValidUtf8(d.value()) : std::string();
  };
  return 0;
}

std::shared_ptr<const sd::generate::TokenTable> tokenTable(const GenerationSetup &g, int64_t vocab) {
  using Kind = sd::generate::TokenTable::Kind;
  auto table = std::make_shared<sd::generate::TokenTable>();
  table->bytes.assign(size_t(vocab), "");
  table->kinds.assign(size_t(vocab), Kind::Other);
  if (!g.tokenizer) {
    for (int64_t t = 0; t < vocab && t < 256; ++t) {
      table->bytes[size_t(t)] = std::string(1, char(uint8_t(t)));
      table->kinds[size_t(t)] = Kind::Text;
    }
  } else {
    std::vector<bool> special;
    std::vector<std::string> bytes = g.tokenizer->tokenBytes(special);
    for (size_t t = 0; t < bytes.size() && t < size_t(vocab); ++t) {
      table->bytes[t] = std::move(bytes[t]);
      table->kinds[t] = special[t] ? Kind::Other : Kind::Text;
    }
  }
  for (int64_t t : g.codec.stopIds)
    if (t >= 0 && t < vocab) table->kinds[size_t(t)] = Kind::End;
  return table;
}

bool jsonFlags(const Flags &f, std::shared_ptr<const sd::generate::JsonGrammar> &grammar) {
  if (hasFlag(f, "--json") && hasFlag(f, "--json-schema"))
    return fail("--json and --json-schema: give one (--json is any JSON object)"), false;
  if (hasFlag(f, "--json")) grammar = sd::generate::JsonGrammar::anyObject();
  if (!hasFlag(f, "--json-schema")) return true;
  const std::string path = flagValue(f, "--json-schema");
  auto text = sd::readWholeFile(path);
  if (!text.isOk()) return fail("--json-schema: " + text.status().message()), false;
  auto compiled = sd::generate::JsonGrammar::fromSchema(text.value());
  if (!compiled.isOk()) return fail("--json-schema " + path + ": " + compiled.status().message()), false;
  grammar = compiled.value();
  return true;
}

sd::StatusOr<std::vector<int64_t>> encodePrompt(const sd::Tokenizer *tokenizer, int64_t vocab, const std::string &text,
                                                bool renderedChat) {
  std::vector<int64_t> ids;
  if (!tokenizer) {
    for (char c : text) ids.push_back(int64_t(uint8_t(c)));
    return ids;
  }
  sd::EncodeOptions eo;
  if (renderedChat) {
    eo.addSpecialTokens = false; // the template writes them
    eo.parseSpecial = true;
  }
  for (int32_t id : tokenizer->encode(text, eo)) {
    if (id >= vocab)
      return sd::sdError("--tokenizer: token ", id, " is outside the model's ", vocab,
                         " logits: the tokenizer does not belong to this model");
    ids.push_back(id);
  }
  return ids;
}

int openDraft(const Flags &f, const sd::SessionOptions &so, size_t speculate, const sd::generate::Generator &target,
              GenerationSetup &g) {
  if (!hasFlag(f, "--draft")) return 0;
  const std::string path = flagValue(f, "--draft");
  if (!speculate)
    return fail("--draft " + path + ": the plan checks no guessed tokens" +
                (target.speculation() ? std::string(" with --speculate 0")
                                      : std::string(" (compile it with --kv-cache L --speculate K)")));
  auto loaded = sd::Plan::loadFile(path);
  if (!loaded.isOk()) return fail("--draft: " + loaded.status().message());
  g.draftPlan = std::move(loaded.value());
  auto session = sd::Session::create(g.draftPlan, so);
  if (!session.isOk()) return fail("--draft " + path + ": " + session.status().message());
  g.draftSession = std::move(session.value());
  auto gen = sd::generate::Generator::create(*g.draftSession, sd::generate::SamplingOptions());
  if (!gen.isOk()) return fail("--draft " + path + ": " + gen.status().message());
  g.draftGen = std::move(gen.value());
  auto draft = sd::generate::DraftModel::create(*g.draftGen, target);
  if (!draft.isOk()) return fail("--draft " + path + ": " + draft.status().message());
  g.draft = std::move(draft.value());
  return 0;
}

bool speculateFlag(const Flags &f, const sd::generate::Generator &gen, size_t &speculate, std::string &err) {
  int64_t n;
  if (!intFlag(f, "--speculate", gen.speculation(), 0, 1 << 20, n, err)) return false;
  if (n > gen.speculation()) {
    err = "--speculate " + std::to_string(n) + ": the plan checks " +
          (gen.speculation() ? "at most " + std::to_string(gen.speculation()) + " guessed tokens a step"
                             : std::string("no guessed tokens (compile it with --kv-cache L --speculate K)"));
    return false;
  }
  speculate = size_t(n);
  return true;
}

} // namespace sdrun
