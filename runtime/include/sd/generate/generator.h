// Token generation from a plan. Two ways, chosen by what the plan holds:
//  - Cached (sdc compile --kv-cache): the prefill and decode entries keep
//    each row's keys and values in the plan's kv_cache state, so a new token
//    costs one decode step. Rows are generated together (the plan's
//    --kv-batch); each row remembers which tokens its cache holds, so a call
//    that extends a row feeds only the new tokens (a prompt in prefill
//    chunks), and one that changes a row's earlier tokens recomputes from the
//    first difference.
//  - Windowed (older plans): the infer entry's batch-1 buckets [1, seq] ->
//    logits [1, seq, vocab] re-run the last `seq` tokens for every token.
// Sampling follows transformers' generate (greedy, temperature, top-k, top-p,
// repetition penalty). The vocabulary is the plan's, read from the logits;
// text <-> tokens is the caller's business.
#pragma once
#include "sd/generate/token_constraint.h"
#include "sd/runtime/session.h"
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

namespace sd::generate {

class DraftModel;

struct SamplingOptions {
  double temperature = 0.8; // 0: greedy
  int64_t topK = 40;        // 0: the whole vocabulary
  uint64_t seed = 0;
  double topP = 1.0;        // nucleus: the fewest top tokens holding this much probability (1: all)
  double repetitionPenalty = 1.0; // > 1 discourages tokens already in the context (transformers' rule)
  // OpenAI's penalties on the tokens of the context from `penaltyFrom` on (a
  // request's generated tokens): each logit less frequency x its count, less
  // presence when it occurs at all.
  double presencePenalty = 0, frequencyPenalty = 0;
  size_t penaltyFrom = 0;
  std::vector<std::pair<int64_t, float>> logitBias; // OpenAI's logit_bias: added to those tokens' logits
};

// One token from one row of logits, as transformers' generate picks it: the
// repetition penalty on the logits of tokens in `context` (divided when
// positive, multiplied when negative), then the presence and frequency
// penalties and the logit bias (added), then greedy at temperature 0, or a draw
// from softmax(logits / temperature) over the top-k, cut to the top-p nucleus.
// With a constraint, only the tokens it allows (the others as if their
// logits were -inf before temperature, top-k and top-p); -1 when it allows none.
int64_t sampleToken(const float *logits, int64_t vocab, const SamplingOptions &opts, std::mt19937_64 &rng,
                    const std::vector<int64_t> &context = {}, const TokenConstraint *constraint = nullptr);

// Log-probabilities under the model's own distribution (the softmax of its
// raw logits: before a repetition penalty, temperature, top-k or top-p).
struct TokenLogprobs {
  int64_t token = -1;
  double logprob = 0;
  std::vector<std::pair<int64_t, double>> top; // the likeliest tokens, likeliest first
};

// What nextBatch gives a row whose constraint allows no token of the
// vocabulary (a schema needing a character no token has): that row cannot go
// on, the others can.
constexpr int64_t kNoAllowedToken = -2;

// One row's sampling when rows differ (a server's requests): its options, its
// own RNG (so a row's draws do not depend on the rows beside it), and the
// log-probabilities it asks for.
struct RowSampler {
  SamplingOptions opts;
  std::mt19937_64 rng;
  // -1: none; k >= 0: each call fills `drawn` with each drawn token's
  // log-probability and the k likeliest tokens' (one entry a token it gave).
  int64_t topLogprobs = -1;
  std::vector<TokenLogprobs> drawn;
  // Set before a row's first call to score its prompt: `prompt` gets the
  // log-probability of each token after the first given those before it
  // (computed from the row's start; a cached copy is not reused). Cleared by
  // that call.
  bool scorePrompt = false;
  std::vector<TokenLogprobs> prompt;
  // Structured output: only tokens it allows are drawn, and each drawn token
  // is given to it (the caller ends the row when it is finished).
  std::shared_ptr<TokenConstraint> constraint;
  RowSampler() = default;
  explicit RowSampler(const SamplingOptions &o) : opts(o), rng(o.seed) {}
};

// The log-probabilities of `token` and of the k likeliest tokens in one row of logits.
TokenLogprobs tokenLogprobs(const float *logits, int64_t vocab, int64_t token, int64_t k);

// An error naming the first option out of range (temperature, top-k, top-p,
// repetition penalty), or ok.
Status checkSampling(const SamplingOptions &opts);

class Generator {
public:
  // Binds to `session` (which must outlive the generator). An error names what
  // the plan lacks: prefill/decode entries, or a batch-1 infer bucket with an
  // int64 [1, seq] token input and f32 [1, seq, vocab] logits.
  static StatusOr<std::unique_ptr<Generator>> create(Session &session, const SamplingOptions &opts);
  int64_t vocabSize() const { return vocab_; }
  // The longest context: the cache length, or the largest window.
  int64_t maxContext() const { return cacheLength_ ? cacheLength_ : windows_.back().seq; }
  // Rows generated together (1 without a cache).
  int64_t batchSize() const { return batch_; }
  bool cached() const { return cacheLength_ > 0; }
  // Prompt or prefix tuning's virtual tokens, which a cache holds before each row's own.
  int64_t virtualTokens() const { return int64_t(virtualIds_.size()); }
  // The most tokens of a row's own text the plan holds: the cache less the
  // virtual tokens before each row, or the window. A prompt must fit it (a
  // window's, with room for the next token).
  int64_t contextRoom() const { return cached() ? maxContext() - virtualTokens() : maxContext(); }
  bool promptFits(size_t tokens) const {
    return cached() ? int64_t(tokens) <= contextRoom() : int64_t(tokens) < contextRoom();
  }

  // The token after `tokens` (at least one), sampled with the generator's RNG.
  StatusOr<int64_t> next(const std::vector<int64_t> &tokens);
  // The token after each row (at most batchSize() rows); an empty row is idle
  // and gets -1. Needs a cache unless there is a single row.
  StatusOr<std::vector<int64_t>> nextBatch(const std::vector<std::vector<int64_t>> &rows);
  // The same, each row drawn with its own sampler (samplers.size() >= rows.size());
  // kNoAllowedToken for a row whose constraint allows none.
  StatusOr<std::vector<int64_t>> nextBatch(const std::vector<std::vector<int64_t>> &rows,
                                           std::vector<RowSampler> &samplers);
  // Guessed tokens one call can check per row: the verify entry's width less
  // one (sdc compile --speculate), 0 without one.
  int64_t speculation() const { return verify_.entry == SIZE_MAX ? 0 : verify_.seq - 1; }
  // A verify step's time over a decode step's, as measured lately (0 until
  // both have run): what guessing costs (sd/generate/speculation.h).
  double verifyCost() const { return verifySeconds_ > 0 && decodeSeconds_ > 0 ? verifySeconds_ / decodeSeconds_ : 0; }
  // A decode step's time in seconds, as measured lately (0 before one).
  double decodeSeconds() const { return decodeSeconds_; }
  // Speculative decoding: up to drafts[b].size() + 1 nextBatch calls in one.
  // Each row is fed with its guessed continuation drafts[b] (in one call when
  // it fits the verify entry), then tokens are drawn at each position in turn
  // exactly as nextBatch would draw them (the row's sampler, RNG and context),
  // the draft standing while the drawn token equals it. So a row gets the same
  // tokens as from that many nextBatch calls: the confirmed draft tokens, then
  // the one drawn where the draft differs (or after all of it). Drawing stops
  // early once a row's constraint is finished, and at kNoAllowedToken (given
  // last). A draft is cut to the room the cache has; rows scoring their
  // prompt take none.
  StatusOr<std::vector<std::vector<int64_t>>> nextBatch(const std::vector<std::vector<int64_t>> &rows,
                                                        std::vector<RowSampler> &samplers,
                                                        const std::vector<std::vector<int64_t>> &drafts);
  // How many leading tokens of `tokens` row `row`'s cache already holds, so a
  // caller can put a continued conversation where its prompt is cached (0
  // without a cache).
  // Only a row whose adapter is `slot` holds any (see setRowAdapter).
  size_t cachedPrefix(size_t row, const std::vector<int64_t> &tokens, int64_t slot = 0) const;
  // A plan of adapter slots (sdc compile --max-loras N, sd/runtime/lora_slots.h):
  // its slots besides slot 0 (0 for other plans), and the slot row `row`'s
  // tokens go through from the next call on (0 at first: the plan's own
  // adapter). A row's cache is kept only while its adapter stays the same;
  // after an adapter is written into a slot, adapterRewritten(slot) drops
  // what the rows of that slot cached.
  int64_t adapterSlots() const { return adapterSlots_; }
  Status setRowAdapter(size_t row, int64_t slot);
  void adapterRewritten(int64_t slot);
  // Appends `maxNew` tokens to `tokens`, calling onToken after each. With
  // `speculate` > 0 (at most speculation()), each step guesses up to that
  // many tokens by prompt lookup and checks them in one call: the same
  // tokens, fewer steps when the text repeats itself. With `draft`
  // (sd/generate/draft_model.h), the guesses are its tokens instead.
  Status generate(std::vector<int64_t> &tokens, int64_t maxNew, const std::function<void(int64_t)> &onToken = {},
                  size_t speculate = 0, DraftModel *draft = nullptr);

private:
  struct Window {
    size_t entry;
    int64_t seq;
  };
  enum class Fed { Tokens, Positions, Adapters };
  struct CachedEntry {
    size_t entry = SIZE_MAX;
    int64_t seq = 0;
    std::vector<Fed> order; // what each input of the entry is
  };
  Generator(Session &s, const SamplingOptions &o) : session_(s), self_(o) {}
  Status bindCache();
  Status bindWindows();
  // Feeds each row's tokens the cache lacks; fills `logits` [rows, last, vocab]
  // with the logits after each of the `last` final tokens of every active row
  // (last: 1 + the row's draft length; its rows' logits at the front).
  // With samplers, rows asking to score their prompt are fed from their start
  // and get the log-probabilities of their tokens after `skip` + 1.
  Status runCached(const std::vector<std::vector<int64_t>> &rows, const std::vector<size_t> &last,
                   std::vector<float> &logits, std::vector<RowSampler> *samplers, size_t skip);
  // The cached entry for calls feeding up to `most` tokens a row: the
  // narrowest that takes them all, else the widest (the prompt in chunks).
  const CachedEntry &entryFor(int64_t most) const;
  StatusOr<int64_t> sampleChecked(const float *logits, const std::vector<int64_t> &context, RowSampler &sampler);
  StatusOr<std::vector<std::vector<int64_t>>> nextRows(const std::vector<std::vector<int64_t>> &rows,
                                                       std::vector<RowSampler> *samplers,
                                                       const std::vector<std::vector<int64_t>> *drafts);
  StatusOr<int64_t> nextWindowed(const std::vector<int64_t> &tokens, RowSampler &sampler);

  Session &session_;
  RowSampler self_; // the rows' sampling when the caller gives none
  int64_t vocab_ = 0, batch_ = 1, cacheLength_ = 0;
  int64_t prefix_ = 0; // windowed: logits positions before the tokens' own (prompt tuning's virtual tokens)
  std::vector<int64_t> virtualIds_; // cached: prompt or prefix tuning's virtual token ids, fed before each row
  std::vector<Window> windows_; // by increasing seq
  std::string tokenInput_;
  CachedEntry prefill_, decode_, verify_;
  double decodeSeconds_ = 0, verifySeconds_ = 0; // recent runs' times (moving averages)
  std::vector<std::vector<int64_t>> cachedTokens_; // per row: the tokens whose keys and values the cache holds
  int64_t adapterSlots_ = 0;         // --max-loras: slots besides slot 0
  std::vector<int64_t> rowAdapters_; // per row: its adapter slot
  std::vector<HostTensor> outs_;
  std::vector<float> logits_; // the wanted positions' logits of the last call, kept for the next
};

} // namespace sd::generate
