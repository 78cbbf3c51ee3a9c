// Token generation from a plan's infer entry: the batch-1 buckets [1, seq] ->
// logits [1, seq, vocab], a window of the last `seq` tokens (no KV cache yet:
// every token re-runs the window), and sampling (greedy, temperature, top-k,
// top-p, repetition penalty).
// The vocabulary is the plan's, read from the logits; text <-> tokens is the
// caller's business (sdrun's --prompt is byte-level).
#pragma once
#include "sd/runtime/session.h"
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

namespace sd::generate {

struct SamplingOptions {
  double temperature = 0.8; // 0: greedy
  int64_t topK = 40;        // 0: the whole vocabulary
  uint64_t seed = 0;
  double topP = 1.0;        // nucleus: the fewest top tokens holding this much probability (1: all)
  double repetitionPenalty = 1.0; // > 1 discourages tokens already in the context (transformers' rule)
};

// One token from one row of logits, as transformers' generate picks it: the
// repetition penalty on the logits of tokens in `context` (divided when
// positive, multiplied when negative), then greedy at temperature 0, or a draw
// from softmax(logits / temperature) over the top-k, cut to the top-p nucleus.
int64_t sampleToken(const float *logits, int64_t vocab, const SamplingOptions &opts, std::mt19937_64 &rng,
                    const std::vector<int64_t> &context = {});

class Generator {
public:
  // Binds to `session` (which must outlive the generator). An error names what
  // the plan lacks: a batch-1 infer bucket with an int64 [1, seq] token input
  // and f32 [1, seq, vocab] logits.
  static StatusOr<std::unique_ptr<Generator>> create(Session &session, const SamplingOptions &opts);
  int64_t vocabSize() const { return vocab_; }
  int64_t maxWindow() const { return buckets_.back().seq; }

  // The token after `tokens` (at least one), sampled with the generator's RNG.
  StatusOr<int64_t> next(const std::vector<int64_t> &tokens);
  // Appends `maxNew` tokens to `tokens`, calling onToken after each.
  Status generate(std::vector<int64_t> &tokens, int64_t maxNew, const std::function<void(int64_t)> &onToken = {});

private:
  struct Bucket {
    size_t entry;
    int64_t seq;
  };
  Generator(Session &s, const SamplingOptions &o) : session_(s), opts_(o), rng_(o.seed) {}
  Session &session_;
  SamplingOptions opts_;
  std::mt19937_64 rng_;
  std::vector<Bucket> buckets_; // by increasing seq
  std::string tokenInput_;
  int64_t vocab_ = 0;
  std::vector<HostTensor> outs_;
};

} // namespace sd::generate
