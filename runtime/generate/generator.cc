// Windowed generation over the infer entry's batch-1 buckets, and sampling.
#include "sd/generate/generator.h"
#include "sd/format/training_abi.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace sd::generate {

int64_t sampleToken(const float *raw, int64_t vocab, const SamplingOptions &opts, std::mt19937_64 &rng,
                    const std::vector<int64_t> &context) {
  std::vector<float> penalized;
  const float *logits = raw;
  if (opts.repetitionPenalty != 1.0 && !context.empty()) {
    penalized.assign(raw, raw + vocab);
    std::vector<bool> seen(size_t(vocab), false);
    for (int64_t t : context)
      if (t >= 0 && t < vocab && !seen[size_t(t)]) {
        seen[size_t(t)] = true;
        float &l = penalized[size_t(t)];
        l = l < 0 ? float(l * opts.repetitionPenalty) : float(l / opts.repetitionPenalty);
      }
    logits = penalized.data();
  }
  if (opts.temperature == 0) return int64_t(std::max_element(logits, logits + vocab) - logits);
  std::vector<int64_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), int64_t(0));
  size_t keep = opts.topK > 0 ? size_t(std::min(opts.topK, vocab)) : size_t(vocab);
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(),
                    [&](int64_t a, int64_t c) { return logits[a] > logits[c]; });
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

StatusOr<std::unique_ptr<Generator>> Generator::create(Session &session, const SamplingOptions &opts) {
  if (!(opts.temperature >= 0) || !std::isfinite(opts.temperature))
    return sdError("temperature must be a finite number >= 0, got ", opts.temperature);
  if (opts.topK < 0) return sdError("top-k must be >= 0, got ", opts.topK);
  if (!(opts.topP > 0 && opts.topP <= 1)) return sdError("top-p must be in (0, 1], got ", opts.topP);
  if (!(opts.repetitionPenalty > 0) || !std::isfinite(opts.repetitionPenalty))
    return sdError("the repetition penalty must be a finite number > 0, got ", opts.repetitionPenalty);
  std::unique_ptr<Generator> g(new Generator(session, opts));
  const Plan &plan = session.plan();
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const EntryDesc &e = plan.entries[i];
    if (e.name != abi::kInfer || e.inputs.size() != 1 || e.outputs.empty()) continue;
    const BufferDesc &in = e.buffers[size_t(e.inputs[0].second)];
    const BufferDesc &out = e.buffers[size_t(e.outputs[0].second)];
    if (in.dtype != DType::I64 || in.dims.size() != 2 || in.dims[0] != 1 || in.dims[1] < 1) continue;
    if (out.dims.size() != 3 || out.dims[0] != 1 || out.dims[1] != in.dims[1] || out.dtype != DType::F32 ||
        out.dims[2] < 1)
      return sdError("the infer entry's first output is ", dtypeName(out.dtype), "[", formatDims(out.dims),
                     "]; generation needs f32 logits [1, ", in.dims[1], ", vocab]");
    if (g->vocab_ && g->vocab_ != out.dims[2]) return sdError("the infer buckets disagree on the vocabulary size");
    g->vocab_ = out.dims[2];
    g->tokenInput_ = e.inputs[0].first;
    g->buckets_.push_back({i, in.dims[1]});
  }
  if (g->buckets_.empty())
    return sdError("the plan has no batch-1 infer bucket with a [1, seq] token input (seq > 0); compile with --shapes ",
                   "TOKENS=1xSEQ (training plans: --infer-shapes TOKENS=1xSEQ)");
  std::sort(g->buckets_.begin(), g->buckets_.end(), [](const Bucket &a, const Bucket &b) { return a.seq < b.seq; });
  return g;
}

StatusOr<int64_t> Generator::next(const std::vector<int64_t> &tokens) {
  if (tokens.empty()) return sdError("generation needs at least one token to continue");
  for (int64_t t : tokens)
    if (t < 0 || t >= vocab_) return sdError("token ", t, " is outside the vocabulary [0, ", vocab_, ")");
  const Bucket *b = &buckets_.back();
  for (const Bucket &c : buckets_)
    if (c.seq >= int64_t(tokens.size())) {
      b = &c;
      break;
    }
  size_t window = std::min(tokens.size(), size_t(b->seq)), start = tokens.size() - window;
  HostTensor ids{tokenInput_, DType::I64, {1, b->seq}, std::vector<uint8_t>(size_t(b->seq) * 8, 0)};
  std::memcpy(ids.data.data(), tokens.data() + start, window * 8);
  SD_RETURN_IF_ERROR(session_.run(b->entry, {&ids}, outs_));
  const float *logits = reinterpret_cast<const float *>(outs_[0].data.data()) + (window - 1) * size_t(vocab_);
  // NaN/Inf weights give NaN logits, and "the most likely token" of those is
  // meaningless: say so rather than print whatever index 0 is.
  for (int64_t v = 0; v < vocab_; ++v)
    if (!std::isfinite(logits[v]))
      return sdError("the model's logits are not finite (", logits[v], " for token ", v, " after ", tokens.size(),
                     " tokens): are its weights or adapter NaN/Inf?");
  return sampleToken(logits, vocab_, opts_, rng_, tokens);
}

Status Generator::generate(std::vector<int64_t> &tokens, int64_t maxNew, const std::function<void(int64_t)> &onToken) {
  for (int64_t i = 0; i < maxNew; ++i) {
    auto t = next(tokens);
    if (!t.isOk()) return t.status();
    tokens.push_back(t.value());
    if (onToken) onToken(t.value());
  }
  return Status::ok();
}

} // namespace sd::generate
