// Continuing many texts with one generator: the decode loop that sdrun
// generate and the C API's batch generation share. Texts go through the
// plan's rows (sdc compile --kv-batch) a batch at a time, in order; each row
// draws with its own sampler (its seed, RNG and constraint), so its tokens do
// not depend on the rows beside it, nor on speculation, nor on the batch it
// falls in.
#pragma once
#include "sd/generate/speculation.h"
#include <cstdint>
#include <functional>
#include <set>
#include <vector>

namespace sd::generate {

// What continueRows needs from its caller about each text.
struct RowCallbacks {
  // The text's tokens so far: its prompt, then every token take() appended.
  std::function<const std::vector<int64_t> &(size_t text)> tokens;
  // Appends a drawn token to the text; true when that ends it (a stop text).
  std::function<bool(size_t text, int64_t token)> take;
  // Once, when a text ends (for any reason); optional.
  std::function<void(size_t text)> ended;
  // After each step (to show what came); optional.
  std::function<void()> stepped;
};

struct RowsOptions {
  int64_t maxNew = 0;          // tokens a text gets at most
  std::set<int64_t> stopIds;   // a drawn one ends its text, not taken (EOS ids)
  std::vector<int64_t> slots;  // text i's adapter slot (Generator::setRowAdapter); empty: slot 0 for all
};

struct RowsSummary {
  bool contextFull = false; // some text stopped at the cache's length before maxNew tokens
  uint64_t rowSteps = 0;    // steps that drew for a text, summed over the texts
  uint64_t drawn = 0;       // tokens drawn (stop ids included)
};

// Continues `texts` texts (each at least one token, within the context),
// gen.batchSize() at a time: text i draws with samplers[i] through the
// adapter slot options.slots[i], with the speculator's guesses (built for
// gen.batchSize() rows; its `most` 0 for none). A text ends after maxNew
// tokens, at a stop id, when take() says so, when its sampler's constraint
// is finished, or when the plan's cache is full. An error names the text
// (1-based) whose constraint allows no token of the vocabulary.
StatusOr<RowsSummary> continueRows(Generator &gen, size_t texts, const RowsOptions &options,
                                   std::vector<RowSampler> &samplers, Speculator &speculator,
                                   const RowCallbacks &callbacks);

} // namespace sd::generate
