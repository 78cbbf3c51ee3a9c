// Generation through the prefill/decode entries' key/value caches, or over
// the infer entry's batch-1 windows; and sampling.
#include "sd/generate/generator.h"
#include "sd/generate/speculation.h"
#include "sd/format/peft.h"
#include "sd/format/training_abi.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

namespace sd::generate {

namespace {

// A draw from softmax(logits / temperature) over `idx` (sorted by falling
// logit), cut to the top-p nucleus.
int64_t drawNucleus(const float *logits, const std::vector<int64_t> &idx, const SamplingOptions &opts,
                    std::mt19937_64 &rng) {
  const size_t keep = idx.size();
  std::vector<double> p(keep);
  double total = 0;
  for (size_t k = 0; k < keep; ++k) total += p[k] = std::exp((double(logits[idx[k]]) - double(logits[idx[0]])) / opts.temperature);
  if (opts.topP < 1.0) { // drop the low tail whose probability is at most 1 - top_p (the top token always stays)
    double tail = 0;
    size_t kept = keep;
    for (size_t k = keep; k-- > 1;) {
      tail += p[k] / total;
      if (tail > 1.0 - opts.topP) break;
      kept = k;
    }
    p.resize(kept);
  }
  std::discrete_distribution<size_t> d(p.begin(), p.end());
  return idx[d(rng)];
}

// Sampling where a constraint allows only some tokens: as if the others'
// logits were -inf before temperature, top-k and top-p (as vLLM applies a
// grammar), while asking the constraint about as few tokens as it can.
// -1 when it allows none.
int64_t sampleConstrained(const float *logits, int64_t vocab, const SamplingOptions &opts, std::mt19937_64 &rng,
                          const TokenConstraint &constraint) {
  std::vector<int64_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), int64_t(0));
  auto higher = [&](int64_t a, int64_t c) { return logits[a] > logits[c] || (logits[a] == logits[c] && a < c); };
  std::vector<int64_t> kept;
  if (opts.temperature == 0 || opts.topK > 0) { // the first 1 (greedy) or k allowed tokens by falling logit
    const size_t want = opts.temperature == 0 ? 1 : size_t(opts.topK);
    size_t sorted = 0;
    for (size_t k = 0; k < idx.size() && kept.size() < want; ++k) {
      if (k == sorted) { // sort in growing slices: most steps look at few tokens
        const size_t next = std::min(idx.size(), std::max<size_t>(64, sorted * 4));
        std::partial_sort(idx.begin() + long(sorted), idx.begin() + long(next), idx.end(), higher);
        sorted = next;
      }
      if (constraint.allows(idx[k])) kept.push_back(idx[k]);
    }
    if (kept.empty()) return -1;
    return opts.temperature == 0 ? kept[0] : drawNucleus(logits, kept, opts, rng);
  }
  if (opts.topP >= 1.0) {
    // Draws from the whole distribution until one is allowed: exactly a draw
    // from the allowed tokens' renormalized distribution. A constraint that
    // rejects what the model wants falls back to asking about every token.
    const float most = *std::max_element(logits, logits + vocab);
    std::vector<double> cdf(static_cast<size_t>(vocab));
    double total = 0;
    for (int64_t v = 0; v < vocab; ++v) cdf[size_t(v)] = total += std::exp((double(logits[v]) - most) / opts.temperature);
    std::uniform_real_distribution<double> u(0.0, total);
    for (int tries = 0; tries < 32; ++tries) {
      const int64_t t = int64_t(std::upper_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
      if (t < vocab && constraint.allows(t)) return t;
    }
  }
  TokenMask mask(vocab);
  constraint.allowedTokens(mask, vocab);
  for (size_t w = 0; w < mask.words.size(); ++w)
    for (uint64_t bits = mask.words[w]; bits; bits &= bits - 1)
      kept.push_back(int64_t(w * 64 + size_t(__builtin_ctzll(bits))));
  if (kept.empty()) return -1;
  std::sort(kept.begin(), kept.end(), higher);
  return drawNucleus(logits, kept, opts, rng);
}

} // namespace

int64_t sampleToken(const float *raw, int64_t vocab, const SamplingOptions &opts, std::mt19937_64 &rng,
                    const std::vector<int64_t> &context, const TokenConstraint *constraint) {
  std::vector<float> penalized;
  const float *logits = raw;
  auto edit = [&]() -> std::vector<float> & {
    if (penalized.empty()) penalized.assign(raw, raw + vocab);
    logits = penalized.data();
    return penalized;
  };
  if (opts.repetitionPenalty != 1.0 && !context.empty()) {
    std::vector<bool> seen(size_t(vocab), false);
    for (int64_t t : context)
      if (t >= 0 && t < vocab && !seen[size_t(t)]) {
        seen[size_t(t)] = true;
        float &l = edit()[size_t(t)];
        l = l < 0 ? float(l * opts.repetitionPenalty) : float(l / opts.repetitionPenalty);
      }
  }
  if ((opts.presencePenalty != 0 || opts.frequencyPenalty != 0) && context.size() > opts.penaltyFrom) {
    std::vector<int64_t> counts(size_t(vocab), 0);
    for (size_t i = opts.penaltyFrom; i < context.size(); ++i)
      if (context[i] >= 0 && context[i] < vocab) ++counts[size_t(context[i])];
    for (int64_t t = 0; t < vocab; ++t)
      if (counts[size_t(t)])
        edit()[size_t(t)] -= float(opts.frequencyPenalty * double(counts[size_t(t)]) + opts.presencePenalty);
  }
  for (const auto &[t, bias] : opts.logitBias)
    if (t >= 0 && t < vocab) edit()[size_t(t)] += bias;
  if (constraint) return sampleConstrained(logits, vocab, opts, rng, *constraint);
  if (opts.temperature == 0) return int64_t(std::max_element(logits, logits + vocab) - logits);
  std::vector<int64_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), int64_t(0));
  size_t keep = opts.topK > 0 ? size_t(std::min(opts.topK, vocab)) : size_t(vocab);
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(),
                    [&](int64_t a, int64_t c) { return logits[a] > logits[c]; });
  idx.resize(keep);
  return drawNucleus(logits, idx, opts, rng);
}

TokenLogprobs tokenLogprobs(const float *logits, int64_t vocab, int64_t token, int64_t k) {
  const double most = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(logits[v]) - most);
  const double norm = most + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = double(logits[token]) - norm;
  k = std::min(k, vocab);
  if (k > 0) {
    std::vector<int64_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), int64_t(0));
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int64_t a, int64_t c) { return logits[a] > logits[c] || (logits[a] == logits[c] && a < c); });
    for (int64_t i = 0; i < k; ++i) out.top.emplace_back(idx[size_t(i)], double(logits[idx[size_t(i)]]) - norm);
  }
  return out;
}

Status checkSampling(const SamplingOptions &opts) {
  if (!(opts.temperature >= 0) || !std::isfinite(opts.temperature))
    return sdError("temperature must be a finite number >= 0, got ", opts.temperature);
  if (opts.topK < 0) return sdError("top-k must be >= 0, got ", opts.topK);
  if (!(opts.topP > 0 && opts.topP <= 1)) return sdError("top-p must be in (0, 1], got ", opts.topP);
  if (!(opts.repetitionPenalty > 0) || !std::isfinite(opts.repetitionPenalty))
    return sdError("the repetition penalty must be a finite number > 0, got ", opts.repetitionPenalty);
  if (!std::isfinite(opts.presencePenalty) || !std::isfinite(opts.frequencyPenalty))
    return sdError("the presence and frequency penalties must be finite numbers");
  for (const auto &[t, bias] : opts.logitBias)
    if (!std::isfinite(bias)) return sdError("the logit bias of token ", t, " is not finite");
  return Status::ok();
}

StatusOr<std::unique_ptr<Generator>> Generator::create(Session &session, const SamplingOptions &opts) {
  SD_RETURN_IF_ERROR(checkSampling(opts));
  std::unique_ptr<Generator> g(new Generator(session, opts));
  const Plan &plan = session.plan();
  // Prompt and prefix tuning: the cached entries take the virtual ids first;
  // the windowed infer entry adds them itself, and a prompt tuning plan's
  // logits cover them too.
  auto adapter = loraConfigFromPlanConfig(plan.config);
  if (adapter.isOk() && (adapter.value().isPromptTuning() || adapter.value().isPrefixTuning())) {
    for (int64_t i = 0; i < adapter.value().numVirtualTokens; ++i)
      g->virtualIds_.push_back(adapter.value().firstVirtualId + i);
    if (adapter.value().isPromptTuning()) g->prefix_ = adapter.value().numVirtualTokens;
  }
  bool hasCache = std::any_of(plan.entries.begin(), plan.entries.end(),
                              [](const EntryDesc &e) { return e.name == abi::kPrefill || e.name == abi::kDecode; });
  g->adapterSlots_ = adapter.isOk() ? adapter.value().maxLoras : 0;
  SD_RETURN_IF_ERROR(hasCache ? g->bindCache() : g->bindWindows());
  return g;
}

// prefill and decode: (tokens, position_ids) int64 [batch, seq] -> logits
// f32 [batch, seq, vocab]; the cache length is the kv_cache globals' dim 2.
Status Generator::bindCache() {
  const Plan &plan = session_.plan();
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const EntryDesc &e = plan.entries[i];
    if (e.name != abi::kPrefill && e.name != abi::kDecode && e.name != abi::kVerify) continue;
    // (tokens, position_ids), and lora_ids [batch] in a plan of adapter slots, in any order.
    size_t tokenAt = SIZE_MAX, positionAt = SIZE_MAX, loraAt = SIZE_MAX;
    for (size_t k = 0; k < e.inputs.size(); ++k)
      (e.inputs[k].first == abi::kPositionIds ? positionAt : e.inputs[k].first == abi::kLoraIds ? loraAt : tokenAt) = k;
    if (e.inputs.size() != (adapterSlots_ ? 3u : 2u) || tokenAt == SIZE_MAX || positionAt == SIZE_MAX ||
        (adapterSlots_ && loraAt == SIZE_MAX) || e.outputs.size() != 1)
      return sdError("the ", e.name, " entry takes ", e.inputs.size(), " inputs and gives ", e.outputs.size(),
                     " outputs; generation needs (tokens, position_ids", adapterSlots_ ? ", lora_ids" : "",
                     ") -> logits");
    CachedEntry c;
    c.entry = i;
    const BufferDesc &tokens = e.buffers[size_t(e.inputs[tokenAt].second)];
    const BufferDesc &positions = e.buffers[size_t(e.inputs[positionAt].second)];
    const BufferDesc &logits = e.buffers[size_t(e.outputs[0].second)];
    if (tokens.dtype != DType::I64 || tokens.dims.size() != 2 || positions.dims != tokens.dims ||
        positions.dtype != DType::I64)
      return sdError("the ", e.name, " entry's inputs are not int64 [batch, seq] tokens and position_ids");
    if (adapterSlots_) {
      const BufferDesc &lora = e.buffers[size_t(e.inputs[loraAt].second)];
      if (lora.dtype != DType::I64 || lora.dims != Dims{tokens.dims[0]})
        return sdError("the ", e.name, " entry's lora_ids input is not int64 [batch]");
    }
    for (size_t k = 0; k < e.inputs.size(); ++k)
      c.order.push_back(k == tokenAt ? Fed::Tokens : k == positionAt ? Fed::Positions : Fed::Adapters);
    if (logits.dtype != DType::F32 || logits.dims.size() != 3 || logits.dims[0] != tokens.dims[0] ||
        logits.dims[1] != tokens.dims[1] || logits.dims[2] < 1)
      return sdError("the ", e.name, " entry's output is ", dtypeName(logits.dtype), "[", formatDims(logits.dims),
                     "]; generation needs f32 logits [batch, seq, vocab]");
    if (vocab_ && vocab_ != logits.dims[2]) return sdError("the prefill and decode entries disagree on the vocabulary");
    if (tokenInput_.empty()) batch_ = tokens.dims[0];
    if (batch_ != tokens.dims[0]) return sdError("the prefill and decode entries disagree on the batch");
    vocab_ = logits.dims[2];
    tokenInput_ = e.inputs[tokenAt].first;
    c.seq = tokens.dims[1];
    (e.name == abi::kPrefill ? prefill_ : e.name == abi::kDecode ? decode_ : verify_) = c;
  }
  if (prefill_.entry == SIZE_MAX || decode_.entry == SIZE_MAX)
    return sdError("the plan has a ", prefill_.entry == SIZE_MAX ? abi::kDecode : abi::kPrefill, " entry but no ",
                   prefill_.entry == SIZE_MAX ? abi::kPrefill : abi::kDecode, " entry");
  for (const GlobalDesc &gl : plan.globals)
    if (gl.role == GlobalRole::KvCache && gl.dims.size() == 4) cacheLength_ = gl.dims[2];
  if (!cacheLength_) return sdError("the plan's prefill and decode entries have no kv_cache state");
  cachedTokens_.assign(size_t(batch_), {});
  rowAdapters_.assign(size_t(batch_), 0);
  return Status::ok();
}

Status Generator::setRowAdapter(size_t row, int64_t slot) {
  if (slot < 0 || slot > adapterSlots_)
    return sdError("adapter slot ", slot, " is outside the plan's 0 to ", adapterSlots_,
                   adapterSlots_ ? "" : " (compile it with sdc compile --max-loras N)");
  if (row >= rowAdapters_.size()) return sdError("row ", row, " is outside the plan's ", rowAdapters_.size(), " rows");
  if (rowAdapters_[row] != slot) cachedTokens_[row].clear(); // its keys and values came through another adapter
  rowAdapters_[row] = slot;
  return Status::ok();
}

void Generator::adapterRewritten(int64_t slot) {
  for (size_t b = 0; b < rowAdapters_.size(); ++b)
    if (rowAdapters_[b] == slot) cachedTokens_[b].clear();
}

Status Generator::bindWindows() {
  const Plan &plan = session_.plan();
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const EntryDesc &e = plan.entries[i];
    if (e.name != abi::kInfer || e.inputs.size() != 1 || e.outputs.empty()) continue;
    const BufferDesc &in = e.buffers[size_t(e.inputs[0].second)];
    const BufferDesc &out = e.buffers[size_t(e.outputs[0].second)];
    if (in.dtype != DType::I64 || in.dims.size() != 2 || in.dims[0] != 1 || in.dims[1] < 1) continue;
    if (out.dims.size() != 3 || out.dims[0] != 1 || out.dims[1] != prefix_ + in.dims[1] || out.dtype != DType::F32 ||
        out.dims[2] < 1)
      return sdError("the infer entry's first output is ", dtypeName(out.dtype), "[", formatDims(out.dims),
                     "]; generation needs f32 logits [1, ", prefix_ + in.dims[1], ", vocab]",
                     prefix_ ? " (the prompt's virtual tokens, then the tokens)" : "");
    if (vocab_ && vocab_ != out.dims[2]) return sdError("the infer buckets disagree on the vocabulary size");
    vocab_ = out.dims[2];
    tokenInput_ = e.inputs[0].first;
    windows_.push_back({i, in.dims[1]});
  }
  if (windows_.empty())
    return sdError("the plan has no batch-1 infer bucket with a [1, seq] token input (seq > 0) and no prefill/decode "
                   "entries; compile with --kv-cache MAX_LENGTH, or --shapes TOKENS=1xSEQ (training plans: "
                   "--infer-shapes TOKENS=1xSEQ)");
  std::sort(windows_.begin(), windows_.end(), [](const Window &a, const Window &b) { return a.seq < b.seq; });
  return Status::ok();
}

// NaN/Inf weights give NaN logits, and "the most likely token" of those is
// meaningless: say so rather than print whatever index 0 is.
StatusOr<int64_t> Generator::sampleChecked(const float *logits, const std::vector<int64_t> &context,
                                           RowSampler &sampler) {
  for (int64_t v = 0; v < vocab_; ++v)
    if (!std::isfinite(logits[v]))
      return sdError("the model's logits are not finite (", logits[v], " for token ", v, " after ", context.size(),
                     " tokens): are its weights or adapter NaN/Inf?");
  const int64_t t = sampleToken(logits, vocab_, sampler.opts, sampler.rng, context, sampler.constraint.get());
  if (t < 0) return kNoAllowedToken;
  if (sampler.constraint) sampler.constraint->accept(t);
  if (sampler.topLogprobs >= 0) sampler.drawn.push_back(tokenLogprobs(logits, vocab_, t, sampler.topLogprobs));
  return t;
}

const Generator::CachedEntry &Generator::entryFor(int64_t most) const {
  const CachedEntry *best = nullptr, *widest = &prefill_;
  for (const CachedEntry *e : {&decode_, &verify_, &prefill_}) {
    if (e->entry == SIZE_MAX) continue;
    if (e->seq >= most && (!best || e->seq < best->seq)) best = e;
    if (e->seq > widest->seq) widest = e;
  }
  return best ? *best : *widest;
}

Status Generator::runCached(const std::vector<std::vector<int64_t>> &rows, const std::vector<size_t> &last,
                            std::vector<float> &logits, std::vector<RowSampler> *samplers, size_t skip) {
  auto scoring = [&](size_t b) { return samplers && b < samplers->size() && (*samplers)[b].scorePrompt; };
  const size_t batch = size_t(batch_);
  std::vector<int64_t> start(batch), pending(batch, 0);
  for (size_t b = 0; b < batch; ++b) {
    const std::vector<int64_t> &cached = cachedTokens_[b];
    if (b >= rows.size() || rows[b].empty()) {
      start[b] = int64_t(cached.size());
      continue;
    }
    const std::vector<int64_t> &row = rows[b];
    size_t same = 0;
    while (same < cached.size() && same < row.size() && cached[same] == row[same]) ++same;
    if (scoring(b)) same = 0; // every position's logits are wanted
    // Cached or not, the final tokens whose logits are wanted run again.
    same = std::min(same, row.size() - last[b]);
    start[b] = int64_t(same);
    pending[b] = int64_t(row.size() - same);
  }
  const size_t width = *std::max_element(last.begin(), last.end());
  // Not cleared: every active row's wanted positions are written below (a
  // large vocabulary times rows times positions is megabytes a step).
  logits.resize(batch * width * size_t(vocab_));
  while (*std::max_element(pending.begin(), pending.end()) > 0) {
    const CachedEntry *chosen = &entryFor(*std::max_element(pending.begin(), pending.end()));
    // A row whose last token takes the cache's last slot leaves no slot for
    // padding: this call feeds one token a row (the others' rest come next).
    for (size_t b = 0; b < batch; ++b)
      if (pending[b] > 0 && pending[b] < chosen->seq && start[b] + pending[b] >= cacheLength_) chosen = &decode_;
    const CachedEntry &e = *chosen;
    const int64_t seq = e.seq;
    HostTensor ids{tokenInput_, DType::I64, {batch_, seq}, std::vector<uint8_t>(batch * size_t(seq) * 8, 0)};
    HostTensor pos{abi::kPositionIds, DType::I64, {batch_, seq}, std::vector<uint8_t>(batch * size_t(seq) * 8, 0)};
    auto *pid = reinterpret_cast<int64_t *>(ids.data.data()), *ppos = reinterpret_cast<int64_t *>(pos.data.data());
    std::vector<int64_t> fed(batch);
    for (size_t b = 0; b < batch; ++b) {
      const int64_t n = std::min(pending[b], seq);
      fed[b] = n;
      for (int64_t t = 0; t < n; ++t) {
        pid[b * size_t(seq) + size_t(t)] = rows[b][size_t(start[b] + t)];
        ppos[b * size_t(seq) + size_t(t)] = start[b] + t;
      }
      // Padding writes its key and value into the row's next free slot, which
      // the row's next real token overwrites before anything reads it.
      int64_t slot = start[b] + n;
      if (n < seq && slot >= cacheLength_) {
        if (n > 0)
          return sdError("row ", b, " fills the key/value cache (", cacheLength_,
                         " positions) while other rows still feed their prompts; compile with a longer --kv-cache");
        slot = cacheLength_ - 1; // an idle full row: its last slot is no longer trusted
      }
      for (int64_t t = n; t < seq; ++t) ppos[b * size_t(seq) + size_t(t)] = slot;
      std::vector<int64_t> &cached = cachedTokens_[b];
      if (n > 0) cached.assign(rows[b].begin(), rows[b].begin() + long(start[b] + n));
      if (n < seq && int64_t(cached.size()) > slot) cached.resize(size_t(slot));
    }
    HostTensor adapters{abi::kLoraIds, DType::I64, {batch_}, std::vector<uint8_t>(batch * 8)};
    std::memcpy(adapters.data.data(), rowAdapters_.data(), batch * 8);
    std::vector<const HostTensor *> in;
    for (Fed f : e.order) in.push_back(f == Fed::Tokens ? &ids : f == Fed::Positions ? &pos : &adapters);
    const auto started = std::chrono::steady_clock::now();
    SD_RETURN_IF_ERROR(session_.run(e.entry, in, outs_));
    if (&e == &decode_ || &e == &verify_) { // what guessing costs: Speculator weighs it
      double &average = &e == &decode_ ? decodeSeconds_ : verifySeconds_;
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      average = average > 0 ? 0.8 * average + 0.2 * took : took;
    }
    const float *out = reinterpret_cast<const float *>(outs_[0].data.data());
    for (size_t b = 0; b < batch; ++b) {
      // A prompt's scores: position p's logits give the probability of token p + 1.
      for (int64_t t = 0; scoring(b) && t < fed[b]; ++t) {
        const size_t next = size_t(start[b] + t + 1);
        if (next > skip && next < rows[b].size())
          (*samplers)[b].prompt.push_back(tokenLogprobs(out + (b * size_t(seq) + size_t(t)) * size_t(vocab_), vocab_,
                                                        rows[b][next], std::max<int64_t>((*samplers)[b].topLogprobs, 0)));
      }
      for (int64_t t = 0; t < fed[b]; ++t) { // the row's final `last` positions
        const int64_t j = start[b] + t - int64_t(rows[b].size() - last[b]);
        if (j >= 0)
          std::memcpy(logits.data() + (b * width + size_t(j)) * size_t(vocab_),
                      out + (b * size_t(seq) + size_t(t)) * size_t(vocab_), size_t(vocab_) * sizeof(float));
      }
      start[b] += fed[b];
      pending[b] -= fed[b];
    }
  }
  return Status::ok();
}

size_t Generator::cachedPrefix(size_t row, const std::vector<int64_t> &tokens, int64_t slot) const {
  if (row >= cachedTokens_.size() || rowAdapters_[row] != slot) return 0;
  const std::vector<int64_t> &cached = cachedTokens_[row];
  if (cached.size() < virtualIds_.size() || !std::equal(virtualIds_.begin(), virtualIds_.end(), cached.begin())) return 0;
  size_t same = 0;
  while (virtualIds_.size() + same < cached.size() && same < tokens.size() &&
         cached[virtualIds_.size() + same] == tokens[same])
    ++same;
  return same;
}

// One token a row: the first of each row's drawn tokens (there are no drafts).
static std::vector<int64_t> firstTokens(const std::vector<std::vector<int64_t>> &drawn) {
  std::vector<int64_t> out;
  for (const auto &d : drawn) out.push_back(d.empty() ? -1 : d[0]);
  return out;
}

StatusOr<std::vector<int64_t>> Generator::nextBatch(const std::vector<std::vector<int64_t>> &rows) {
  auto drawn = nextRows(rows, nullptr, nullptr);
  if (!drawn.isOk()) return drawn.status();
  return firstTokens(drawn.value());
}

StatusOr<std::vector<int64_t>> Generator::nextBatch(const std::vector<std::vector<int64_t>> &rows,
                                                    std::vector<RowSampler> &samplers) {
  auto drawn = nextBatch(rows, samplers, {});
  if (!drawn.isOk()) return drawn.status();
  return firstTokens(drawn.value());
}

StatusOr<std::vector<std::vector<int64_t>>> Generator::nextBatch(const std::vector<std::vector<int64_t>> &rows,
                                                                 std::vector<RowSampler> &samplers,
                                                                 const std::vector<std::vector<int64_t>> &drafts) {
  if (samplers.size() < rows.size()) return sdError(rows.size(), " rows but ", samplers.size(), " samplers");
  for (const RowSampler &s : samplers) SD_RETURN_IF_ERROR(checkSampling(s.opts));
  return nextRows(rows, &samplers, &drafts);
}

StatusOr<std::vector<std::vector<int64_t>>> Generator::nextRows(const std::vector<std::vector<int64_t>> &rows,
                                                                std::vector<RowSampler> *samplers,
                                                                const std::vector<std::vector<int64_t>> *drafts) {
  if (int64_t(rows.size()) > batch_)
    return sdError(rows.size(), " rows, but the plan generates ", batch_, " at a time (sdc compile --kv-batch)");
  std::vector<std::vector<int64_t>> out(rows.size());
  for (size_t b = 0; samplers && b < rows.size(); ++b) (*samplers)[b].drawn.clear();
  if (!cached()) {
    if (rows.size() != 1) return sdError("generating several rows together needs a plan compiled with --kv-cache");
    if (rows[0].empty()) return out;
    auto t = nextWindowed(rows[0], samplers ? (*samplers)[0] : self_);
    if (!t.isOk()) return t.status();
    out[0] = {t.value()};
    return out;
  }
  for (size_t b = 0; b < rows.size(); ++b) {
    for (int64_t t : rows[b])
      if (t < 0 || t >= vocab_) return sdError("row ", b, ": token ", t, " is outside the vocabulary [0, ", vocab_, ")");
    if (int64_t(virtualIds_.size() + rows[b].size()) > cacheLength_)
      return sdError("row ", b, " is ", rows[b].size(), " tokens", virtualIds_.empty() ? "" : " after the prompt's ",
                     virtualIds_.empty() ? "" : std::to_string(virtualIds_.size()) + " virtual tokens",
                     ", longer than the plan's key/value cache of ", cacheLength_, " positions (sdc compile --kv-cache)");
  }
  // Each row's draft that fits the cache.
  std::vector<std::vector<int64_t>> guess(rows.size());
  std::vector<size_t> last(size_t(batch_), 1);
  bool guessed = false;
  for (size_t b = 0; drafts && b < rows.size() && b < drafts->size(); ++b) {
    if (rows[b].empty() || (samplers && (*samplers)[b].scorePrompt)) continue;
    const size_t room = size_t(cacheLength_) - virtualIds_.size() - rows[b].size();
    const std::vector<int64_t> &d = (*drafts)[b];
    guess[b].assign(d.begin(), d.begin() + long(std::min(room, d.size())));
    for (int64_t t : guess[b])
      if (t < 0 || t >= vocab_) return sdError("row ", b, ": guessed token ", t, " is outside the vocabulary");
    last[b] = guess[b].size() + 1;
    guessed = guessed || !guess[b].empty();
  }
  // Each row as fed, when that is more than its tokens: the virtual ids
  // first, the draft last (a copy of every row each step only then).
  std::vector<std::vector<int64_t>> fed;
  if (guessed || !virtualIds_.empty()) {
    fed.resize(rows.size());
    for (size_t b = 0; b < rows.size(); ++b) {
      if (rows[b].empty()) continue;
      fed[b] = virtualIds_;
      fed[b].insert(fed[b].end(), rows[b].begin(), rows[b].end());
      fed[b].insert(fed[b].end(), guess[b].begin(), guess[b].end());
    }
  }
  std::vector<float> &logits = logits_;
  SD_RETURN_IF_ERROR(runCached(fed.empty() ? rows : fed, last, logits, samplers, virtualIds_.size()));
  const size_t width = *std::max_element(last.begin(), last.end());
  for (size_t b = 0; samplers && b < rows.size(); ++b)
    if (!rows[b].empty()) (*samplers)[b].scorePrompt = false;
  for (size_t b = 0; b < rows.size(); ++b) {
    if (rows[b].empty()) continue;
    RowSampler &sampler = samplers ? (*samplers)[b] : self_;
    std::vector<int64_t> extended; // the row and the guesses confirmed so far, once one is
    for (size_t j = 0; j <= guess[b].size(); ++j) {
      auto t = sampleChecked(logits.data() + (b * width + j) * size_t(vocab_), j ? extended : rows[b], sampler);
      if (!t.isOk()) return t.status();
      out[b].push_back(t.value());
      const bool confirmed = j < guess[b].size() && t.value() == guess[b][j];
      if (!confirmed || (sampler.constraint && sampler.constraint->finished())) break;
      if (extended.empty()) extended = rows[b];
      extended.push_back(t.value());
    }
  }
  return out;
}

StatusOr<int64_t> Generator::next(const std::vector<int64_t> &tokens) {
  if (tokens.empty()) return sdError("generation needs at least one token to continue");
  if (cached()) {
    auto r = nextBatch({tokens});
    if (!r.isOk()) return r.status();
    return r.value()[0];
  }
  return nextWindowed(tokens, self_);
}

StatusOr<int64_t> Generator::nextWindowed(const std::vector<int64_t> &tokens, RowSampler &sampler) {
  for (int64_t t : tokens)
    if (t < 0 || t >= vocab_) return sdError("token ", t, " is outside the vocabulary [0, ", vocab_, ")");
  const Window *w = &windows_.back();
  for (const Window &c : windows_)
    if (c.seq >= int64_t(tokens.size())) {
      w = &c;
      break;
    }
  size_t window = std::min(tokens.size(), size_t(w->seq)), start = tokens.size() - window;
  HostTensor ids{tokenInput_, DType::I64, {1, w->seq}, std::vector<uint8_t>(size_t(w->seq) * 8, 0)};
  std::memcpy(ids.data.data(), tokens.data() + start, window * 8);
  SD_RETURN_IF_ERROR(session_.run(w->entry, {&ids}, outs_));
  const float *logits = reinterpret_cast<const float *>(outs_[0].data.data());
  if (sampler.scorePrompt) { // position i's logits give the probability of token start + i + 1
    for (size_t i = 0; i + 1 < window; ++i)
      sampler.prompt.push_back(tokenLogprobs(logits + (size_t(prefix_) + i) * size_t(vocab_), vocab_,
                                             tokens[start + i + 1], std::max<int64_t>(sampler.topLogprobs, 0)));
    sampler.scorePrompt = false;
  }
  return sampleChecked(logits + (size_t(prefix_) + window - 1) * size_t(vocab_), tokens, sampler);
}

Status Generator::generate(std::vector<int64_t> &tokens, int64_t maxNew, const std::function<void(int64_t)> &onToken,
                           size_t speculate, DraftModel *draft) {
  if (int64_t(speculate) > speculation())
    return sdError("speculation of ", speculate, " tokens a step, but the plan checks ", speculation(),
                   " (sdc compile --speculate)");
  if (tokens.empty()) return sdError("generation needs at least one token to continue");
  Speculator speculator(speculate, 1, false, draft);
  std::vector<RowSampler> row{self_}; // the generator's own draws, as next() makes them
  for (int64_t made = 0; made < maxNew;) {
    const std::vector<std::vector<int64_t>> rows{tokens};
    // The step draws one more token than it guesses.
    const auto guesses = speculator.guess(rows, {size_t(maxNew - made - 1)}, verifyCost(), decodeSeconds());
    if (!guesses.isOk()) return self_ = row[0], guesses.status();
    auto drawn = nextRows(rows, &row, &guesses.value());
    if (!drawn.isOk()) return self_ = row[0], drawn.status();
    speculator.drawn(drawn.value());
    for (int64_t t : drawn.value()[0]) {
      if (made == maxNew) break;
      tokens.push_back(t);
      ++made;
      if (onToken) onToken(t);
    }
  }
  self_ = row[0];
  return Status::ok();
}

} // namespace sd::generate
