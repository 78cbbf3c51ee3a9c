// What `sdrun generate` and `sdrun serve` open before their first token: the
// plan in a session (--adapter, --adapter-rank and the device flags applied),
// a generator on it, and the text codec (--tokenizer's, or bytes for a
// byte-level model).
#pragma once
#include "flags.h"
#include "text_rows.h"
#include "sd/generate/draft_model.h"
#include "sd/generate/generator.h"
#include "sd/generate/json_grammar.h"
#include "sd/runtime/plan.h"
#include "sd/runtime/session.h"
#include "sd/tokenize/tokenizer.h"
#include <memory>

namespace sdrun {

struct GenerationSetup {
  std::shared_ptr<const sd::Plan> plan;
  std::unique_ptr<sd::Session> session;
  std::unique_ptr<sd::generate::Generator> gen;
  std::unique_ptr<sd::Tokenizer> tokenizer; // with --tokenizer
  // Decoding stops at the tokenizer's EOS, generation_config.json's
  // eos_token_id beside it, and any --stop-token.
  TextCodec codec;
  // --draft PLAN: the draft model's plan, session, generator and guesses.
  std::shared_ptr<const sd::Plan> draftPlan;
  std::unique_ptr<sd::Session> draftSession;
  std::unique_ptr<sd::generate::Generator> draftGen;
  std::unique_ptr<sd::generate::DraftModel> draft;
};

// Whether the plan was compiled with --recipe classify (its infer entry gives class logits).
bool isClassifier(const sd::Plan &plan);

// A session on `plan` with the adapter in DIR `adapter` (none: empty) loaded
// and --adapter-rank applied; errors name f.plan or the adapter's files.
sd::StatusOr<std::unique_ptr<sd::Session>> openSession(const Flags &f, const std::shared_ptr<const sd::Plan> &plan,
                                                       const std::string &adapter, const sd::SessionOptions &so);

// Opens f.plan for generation (loading it unless out.plan is set) with
// --adapter's adapter, and the tokenizer (--chat-template FILE replacing its
// template); 0, or fail()'s code with the error printed.
// `validUtf8`: a byte-level model's text has invalid bytes as U+FFFD (JSON
// needs UTF-8), else its bytes pass through as generated.
int openGeneration(const Flags &f, const sd::SessionOptions &so, const sd::generate::SamplingOptions &sampling,
                   bool validUtf8, GenerationSetup &out);

// The tokenizer: --tokenizer's, else the one the plan carries (sdc compile
// --tokenizer), with --chat-template's template when given; null when there is
// neither. `genConfig`/`genConfigName`: the generation_config.json beside it
// (or carried), when there.
sd::StatusOr<std::unique_ptr<sd::Tokenizer>> openTokenizer(const Flags &f, const sd::Plan &plan, std::string &genConfig,
                                                           std::string &genConfigName);

// The model's tokens as text for structured output: the tokenizer's token
// bytes (bytes themselves for a byte-level model), stop ids as ends, special
// tokens and ids past the tokenizer's vocabulary never generated.
std::shared_ptr<const sd::generate::TokenTable> tokenTable(const GenerationSetup &g, int64_t vocab);

// A row constraint for `sdrun generate --json` / `--json-schema FILE` (null
// when neither is given); false with the error printed.
bool jsonFlags(const Flags &f, std::shared_ptr<const sd::generate::JsonGrammar> &grammar);

// --speculate N: tokens guessed a row and step (by default all the plan's
// verify entry checks, sdc compile --speculate; 0: none); false with the
// error in `err` (N past what the plan checks).
bool speculateFlag(const Flags &f, const sd::generate::Generator &gen, size_t &speculate, std::string &err);

// --draft PLAN: opens the draft model (same device flags, no adapter) whose
// greedy tokens are the guesses instead of prompt lookup's; needs the plan's
// verify entry (speculate > 0). 0, or fail()'s code with the error printed.
int openDraft(const Flags &f, const sd::SessionOptions &so, size_t speculate, const sd::generate::Generator &target,
              GenerationSetup &g);

// The token ids of `text`: with the tokenizer (when not null) (BOS/EOS as its post-processor
// adds them; a rendered chat has its special tokens parsed and none added, as
// apply_chat_template does), else its bytes. An id the model has no logit for
// is an error (the tokenizer is not this model's).
sd::StatusOr<std::vector<int64_t>> encodePrompt(const sd::Tokenizer *tokenizer, int64_t vocab, const std::string &text,
                                                bool renderedChat);

} // namespace sdrun
