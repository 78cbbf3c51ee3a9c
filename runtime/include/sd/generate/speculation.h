// When speculative decoding guesses. A step through the verify entry (K + 1
// tokens a row) costs more than a decode step: for a small model on a CPU,
// compute-bound, up to K + 1 times as much; for a large one, bound by reading
// its weights, little more. It pays when the guesses it confirms make up for
// that, which depends on the model, the text and the machine; so each row's
// rate of confirmed guesses is learned as it goes (also from steps that guess
// nothing: the token drawn is compared with what would have been guessed), the
// two entries' times are measured (Generator::verifyCost), and a step guesses
// only when it is expected to give more tokens a second than a decode step.
// The expectation is calibrated by what the steps that guessed gave: rates
// learned token by token overrate bursts of repeats, and a step guesses just
// when they run high.
// The tokens drawn are the same either way.
//
// Guesses come from prompt lookup (free: every step has them, so rates learn
// on decode steps too), or from a draft model (sd/generate/draft_model.h),
// which costs its own decode calls: it runs only in steps that check its
// guesses, its time counts in the step's cost, and a row's rate learns only
// from checks (fading back toward one in two while unchecked, so a row whose
// draft stopped paying tries again).
#pragma once
#include "sd/generate/draft_model.h"
#include "sd/generate/prompt_lookup.h"
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sd::generate {

class Speculator {
public:
  // Up to `most` guessed tokens a row and step, for `rows` rows; `always`:
  // every guess is checked, whatever it is expected to give (to compare).
  // With `draft`, its guesses instead of prompt lookup's.
  Speculator(size_t most, size_t rows, bool always = false, DraftModel *draft = nullptr);

  // This step's guesses, a row each (empty rows are idle; row b's no longer
  // than room[b]): prompt lookup's (or the draft's) for every row that has
  // one when a verify step is expected to pay, else none. verifyCost: a
  // verify step's time over a decode step's (0 while not both measured: then
  // each is tried); decodeSeconds: a decode step's time (for a draft's cost).
  StatusOr<std::vector<std::vector<int64_t>>> guess(const std::vector<std::vector<int64_t>> &rows,
                                                    const std::vector<size_t> &room, double verifyCost,
                                                    double decodeSeconds = 0);
  // What each row drew this step (after guess()): its rate of confirmed
  // guesses moves.
  void drawn(const std::vector<std::vector<int64_t>> &drawn);
  // A new text in `row` (a served request): its rate starts again.
  void restart(size_t row);

  uint64_t guessed() const { return guessed_; }     // tokens guessed in steps that checked them
  uint64_t confirmed() const { return confirmed_; } // of those, drawn too

private:
  struct Rate { // a row's confirmed guesses, recent ones weighing most
    double hits = 1, tries = 2; // the prior: one in two
    double value() const { return hits / tries; }
    void add(double h, double t);
    void fade(); // a step toward the prior
  };
  size_t most_;
  bool always_;
  DraftModel *draft_;
  PromptLookup lookup_;
  std::vector<Rate> rates_;
  // Guesses expected to hold and held in the steps that checked them (decaying
  // sums): their ratio scales what the rates expect.
  double expectedHeld_ = 1, held_ = 1, expectedNow_ = 0;
  std::vector<std::vector<int64_t>> wouldGuess_, sent_; // this step's lookups; those checked
  uint64_t guessed_ = 0, confirmed_ = 0;
  int64_t sinceDecode_ = 0; // verify steps since a decode step was timed
};

} // namespace sd::generate
