// Opening a plan for generation (shared by sdrun generate and sdrun serve).
#include "generate_setup.h"
#include "commands.h"
#include "sd/format/json.h"

namespace sdrun {

int openGeneration(const Flags &f, const sd::SessionOptions &so, const sd::generate::SamplingOptions &sampling,
                   bool validUtf8, GenerationSetup &out) {
  auto loaded = sd::Plan::loadFile(f.plan);
  if (!loaded.isOk()) return fail(loaded.status().message());
  out.plan = std::move(loaded.value());
  if (auto cfg = sd::parseJson(out.plan->config.empty() ? "{}" : out.plan->config, "the plan's config");
      cfg.isOk() && cfg.value().get("classify"))
    return fail(f.plan + ": a classification plan (sdc compile --recipe classify): its infer entry gives class "
                "logits, not next-token logits; run it with sdrun infer");
  auto session = sd::Session::create(out.plan, so);
  if (!session.isOk()) return fail(session.status().message());
  out.session = std::move(session.value());
  if (hasFlag(f, "--adapter"))
    if (auto st = loadAdapterFlag(f.plan, flagValue(f, "--adapter"), *out.session); !st.isOk()) return fail(st.message());
  if (auto st = adapterRankFlag(f, *out.session); !st.isOk()) return fail(st.message());
  auto gen = sd::generate::Generator::create(*out.session, sampling);
  if (!gen.isOk()) return fail(f.plan + ": " + gen.status().message());
  out.gen = std::move(gen.value());
  const int64_t vocab = out.gen->vocabSize();
  std::vector<int64_t> stopIds;
  std::string err;
  if (!intFlags(f, "--stop-token", 0, vocab - 1, stopIds, err)) return fail(err);
  out.codec.stopIds.insert(stopIds.begin(), stopIds.end());
  if (!hasFlag(f, "--tokenizer")) {
    if (vocab != 256)
      return fail(f.plan + ": the model has " + std::to_string(vocab) +
                  " logits per position, not 256 bytes: give --tokenizer DIR");
    out.codec.decode = [validUtf8](const std::vector<int64_t> &ids) {
      std::string bytes(ids.begin(), ids.end());
      return validUtf8 ? sd::toValidUtf8(bytes) : bytes;
    };
    out.codec.piece = [](int64_t id) { return sd::toValidUtf8(std::string(1, char(uint8_t(id)))); };
    return 0;
  }
  const std::string dir = flagValue(f, "--tokenizer");
  auto tok = sd::Tokenizer::load(dir);
  if (!tok.isOk()) return fail("--tokenizer: " + tok.status().message());
  out.tokenizer = std::move(tok.value());
  if (out.tokenizer->eosId() >= 0) out.codec.stopIds.insert(out.tokenizer->eosId());
  if (auto st = generationConfigEos(dir, out.codec.stopIds); !st.isOk()) return fail(st.message());
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

} // namespace sdrun
