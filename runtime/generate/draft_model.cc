// A draft model's guesses (sd/generate/draft_model.h).
#include "sd/generate/draft_model.h"
#include <algorithm>
#include <chrono>

namespace sd::generate {

StatusOr<std::unique_ptr<DraftModel>> DraftModel::create(Generator &draft, const Generator &target) {
  if (!draft.cached()) return sdError("the draft plan has no key/value cache (compile it with --kv-cache)");
  if (draft.vocabSize() != target.vocabSize())
    return sdError("the draft model has ", draft.vocabSize(), " logits, the model ", target.vocabSize(),
                   ": a draft needs the same tokenizer");
  if (draft.batchSize() < target.batchSize())
    return sdError("the draft plan generates ", draft.batchSize(), " rows at a time, the plan ", target.batchSize(),
                   " (compile the draft with --kv-batch ", target.batchSize(), ")");
  if (draft.maxContext() - draft.virtualTokens() < target.maxContext() - target.virtualTokens())
    return sdError("the draft plan's context (", draft.maxContext() - draft.virtualTokens(), " tokens) is shorter than the plan's (",
                   target.maxContext() - target.virtualTokens(), "; compile the draft with a --kv-cache as long)");
  std::unique_ptr<DraftModel> d(new DraftModel(draft));
  SamplingOptions greedy;
  greedy.temperature = 0;
  d->greedy_.assign(size_t(draft.batchSize()), RowSampler(greedy));
  return d;
}

StatusOr<std::vector<std::vector<int64_t>>> DraftModel::guess(const std::vector<std::vector<int64_t>> &rows,
                                                              const std::vector<size_t> &counts) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::vector<int64_t>> out(rows.size()), feed(rows.size());
  size_t most = 0;
  for (size_t b = 0; b < rows.size(); ++b)
    if (!rows[b].empty() && b < counts.size()) most = std::max(most, counts[b]);
  for (size_t k = 0; k < most; ++k) {
    for (size_t b = 0; b < rows.size(); ++b) {
      feed[b].clear();
      if (rows[b].empty() || b >= counts.size() || out[b].size() >= counts[b]) continue;
      feed[b] = rows[b];
      feed[b].insert(feed[b].end(), out[b].begin(), out[b].end());
    }
    auto next = draft_.nextBatch(feed, greedy_);
    if (!next.isOk()) return next.status().withContext("the draft model: ");
    for (size_t b = 0; b < rows.size(); ++b)
      if (!feed[b].empty()) out[b].push_back(next.value()[b]);
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double perCall = most ? took / double(most) : 0;
  if (most) seconds_ = seconds_ > 0 ? 0.8 * seconds_ + 0.2 * perCall : perCall;
  return out;
}

} // namespace sd::generate
