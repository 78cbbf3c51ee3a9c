#include "sd/generate/continue_rows.h"
#include <algorithm>

namespace sd::generate {

StatusOr<RowsSummary> continueRows(Generator &gen, size_t texts, const RowsOptions &options,
                                   std::vector<RowSampler> &samplers, Speculator &speculator,
                                   const RowCallbacks &callbacks) {
  if (samplers.size() < texts) return sdError(texts, " texts but ", samplers.size(), " samplers");
  if (!options.slots.empty() && options.slots.size() != texts)
    return sdError(texts, " texts but ", options.slots.size(), " adapter slots");
  const size_t batch = size_t(gen.batchSize());
  RowsSummary summary;
  std::vector<char> done(texts, 0);
  if (options.maxNew <= 0) {
    for (size_t i = 0; i < texts && callbacks.ended; ++i) callbacks.ended(i);
    return summary;
  }
  for (size_t first = 0; first < texts; first += batch) {
    const size_t last = std::min(texts, first + batch);
    std::vector<int64_t> made(last - first, 0);
    for (size_t b = 0; b < last - first; ++b) {
      speculator.restart(b);
      const int64_t slot = options.slots.empty() ? 0 : options.slots[first + b];
      if (gen.adapterSlots() == 0 && slot == 0) continue; // no slots: every row is the plan's own
      if (Status s = gen.setRowAdapter(b, slot); !s.isOk()) return sdError("text ", first + b + 1, ": ", s.message());
    }
    for (;;) {
      std::vector<std::vector<int64_t>> rows(last - first);
      std::vector<size_t> room(last - first, 0);
      for (size_t i = first; i < last; ++i) {
        if (done[i]) continue;
        rows[i - first] = callbacks.tokens(i);
        room[i - first] = size_t(options.maxNew - made[i - first] - 1); // a step draws one more than it guesses
      }
      if (std::all_of(rows.begin(), rows.end(), [](const auto &r) { return r.empty(); })) break;
      auto guesses = speculator.guess(rows, room, gen.verifyCost(), gen.decodeSeconds());
      if (!guesses.isOk()) return guesses.status();
      std::vector<RowSampler> slice(samplers.begin() + long(first), samplers.begin() + long(last));
      auto next = gen.nextBatch(rows, slice, guesses.value());
      if (!next.isOk()) return next.status();
      std::copy(slice.begin(), slice.end(), samplers.begin() + long(first)); // their RNGs moved on
      speculator.drawn(next.value());
      for (size_t i = first; i < last; ++i) {
        if (done[i]) continue;
        const std::vector<int64_t> &drawn = next.value()[i - first];
        summary.rowSteps += !drawn.empty();
        for (size_t k = 0; k < drawn.size() && !done[i]; ++k) {
          const int64_t t = drawn[k];
          if (t == kNoAllowedToken)
            return sdError("no token of the model's vocabulary can continue the text of prompt ", i + 1,
                           " as its constraint asks");
          ++summary.drawn;
          const int64_t count = ++made[i - first];
          if (options.stopIds.count(t)) {
            done[i] = 1;
            break;
          }
          done[i] = callbacks.take(i, t);
          if (samplers[i].constraint && samplers[i].constraint->finished()) done[i] = 1;
          // The cache is full: the token just drawn cannot be fed again.
          if (gen.cached() && int64_t(callbacks.tokens(i).size()) >= gen.contextRoom() && !done[i]) {
            done[i] = 1;
            summary.contextFull = summary.contextFull || count < options.maxNew;
          }
          if (count >= options.maxNew) done[i] = 1;
        }
        if (done[i] && callbacks.ended) callbacks.ended(i);
      }
      if (callbacks.stepped) callbacks.stepped();
    }
  }
  return summary;
}

} // namespace sd::generate
