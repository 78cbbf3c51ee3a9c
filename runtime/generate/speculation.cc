// When speculative decoding guesses (sd/generate/speculation.h).
#include "sd/generate/speculation.h"
#include <algorithm>

namespace sd::generate {

namespace {
constexpr double kDecay = 0.9;       // a row's rate: each step's observations weigh 1, older ones 0.9 per step
constexpr int64_t kRetimeEvery = 64; // verify steps before a decode step is timed again
constexpr double kCalibrationDecay = 0.95; // per checking step
// Each step that has guesses, the calibration's evidence fades toward its prior (1 of 1): after
// checks that failed, steps stop checking and so stop learning; this brings
// them back to try again within some hundred steps.
constexpr double kCalibrationFade = 0.99;
} // namespace

void Speculator::Rate::add(double h, double t) {
  hits = kDecay * hits + h;
  tries = kDecay * tries + t;
}

void Speculator::Rate::fade() {
  hits = kCalibrationFade * hits + (1 - kCalibrationFade) * Rate().hits;
  tries = kCalibrationFade * tries + (1 - kCalibrationFade) * Rate().tries;
}

Speculator::Speculator(size_t most, size_t rows, bool always, DraftModel *draft)
    : most_(most), always_(always), draft_(draft), rates_(rows), wouldGuess_(rows), sent_(rows) {}

void Speculator::restart(size_t row) {
  if (row < rates_.size()) rates_[row] = Rate();
}

StatusOr<std::vector<std::vector<int64_t>>> Speculator::guess(const std::vector<std::vector<int64_t>> &rows,
                                                              const std::vector<size_t> &room, double verifyCost,
                                                              double decodeSeconds) {
  const size_t n = std::min(rows.size(), rates_.size());
  double active = 0; // rows stepping
  // Tokens a verify step is expected to give by the rates, with up to k
  // guesses a row (prompt lookup: as many as it has): 1 + a + a^2 + ..., the
  // drawn token, then each guess confirmed only if those before it were.
  std::vector<double> expected(most_ + 1, 0.0);
  std::vector<size_t> counts(rates_.size(), 0);
  for (size_t b = 0; b < rates_.size(); ++b) {
    wouldGuess_[b].clear();
    sent_[b].clear();
    if (b >= n || rows[b].empty()) continue;
    ++active;
    counts[b] = std::min(most_, b < room.size() ? room[b] : 0);
    if (counts[b] && !draft_) wouldGuess_[b] = lookup_.guess(rows[b], counts[b]);
    const size_t guesses = draft_ ? counts[b] : wouldGuess_[b].size();
    double term = 1, sum = 0;
    for (size_t k = 0; k <= most_; ++k) {
      if (k <= guesses) sum += term, term *= rates_[b].value();
      expected[k] += sum;
    }
  }
  if (expected[most_] <= active) { // no row has a guess: a decode step
    sinceDecode_ = 0;
    return sent_;
  }
  expectedHeld_ = kCalibrationFade * expectedHeld_ + (1 - kCalibrationFade);
  held_ = kCalibrationFade * held_ + (1 - kCalibrationFade);
  const double calibration = held_ / expectedHeld_;
  // A draft's calls cost too, one a guess (unknown before its first: then
  // tried); so a draft guesses as many tokens as gives the most a second.
  const double callCost = draft_ && decodeSeconds > 0 ? draft_->secondsPerCall() / decodeSeconds : 0;
  size_t k = most_;
  auto rate = [&](size_t g) { return (active + calibration * (expected[g] - active)) / (verifyCost + double(g) * callCost); };
  if (draft_ && callCost > 0 && verifyCost > 0)
    for (size_t g = 1; g < most_; ++g)
      if (rate(g) > rate(k)) k = g;
  bool verify;
  if (always_) verify = true;
  else if (verifyCost <= 0) verify = sinceDecode_ == 0; // one decode step timed, then a verify step
  else if (sinceDecode_ >= kRetimeEvery) verify = false; // the decode step's time moves with the context
  else verify = rate(k) > active;
  sinceDecode_ = verify ? sinceDecode_ + 1 : 0;
  expectedNow_ = verify ? expected[k] - active : 0;
  if (draft_ && !verify) // unchecked rows drift back toward the prior, to try the draft again
    for (size_t b = 0; b < n; ++b)
      if (!rows[b].empty()) rates_[b].fade();
  if (draft_ && verify) {
    for (size_t &c : counts) c = std::min(c, k);
    auto drafted = draft_->guess(rows, counts);
    if (!drafted.isOk()) return drafted.status();
    wouldGuess_ = std::move(drafted.value());
    wouldGuess_.resize(rates_.size());
  }
  if (verify) sent_ = wouldGuess_;
  return sent_;
}

void Speculator::drawn(const std::vector<std::vector<int64_t>> &drawn) {
  double heldNow = 0;
  for (size_t b = 0; b < std::min(drawn.size(), rates_.size()); ++b) {
    const std::vector<int64_t> &would = wouldGuess_[b], &d = drawn[b];
    if (would.empty() || d.empty()) continue;
    if (sent_[b].empty()) { // not checked: the drawn token against the first guess
      rates_[b].add(d[0] == would[0] ? 1 : 0, 1);
      continue;
    }
    size_t hits = 0;
    while (hits < would.size() && hits < d.size() && d[hits] == would[hits]) ++hits;
    rates_[b].add(double(hits), double(hits + (hits < would.size())));
    guessed_ += would.size();
    confirmed_ += hits;
    heldNow += double(hits);
  }
  if (expectedNow_ > 0) {
    expectedHeld_ = kCalibrationDecay * expectedHeld_ + expectedNow_;
    held_ = kCalibrationDecay * held_ + heldNow;
  }
}

} // namespace sd::generate
