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

Speculator::Speculator(size_t most, size_t rows, bool always)
    : most_(most), always_(always), rates_(rows), wouldGuess_(rows), sent_(rows) {}

void Speculator::restart(size_t row) {
  if (row < rates_.size()) rates_[row] = Rate();
}

std::vector<std::vector<int64_t>> Speculator::guess(const std::vector<std::vector<int64_t>> &rows,
                                                    const std::vector<size_t> &room, double verifyCost) {
  const size_t n = std::min(rows.size(), rates_.size());
  double expected = 0, active = 0; // tokens a verify step is expected to give by the rates, rows stepping
  for (size_t b = 0; b < rates_.size(); ++b) {
    wouldGuess_[b].clear();
    sent_[b].clear();
    if (b >= n || rows[b].empty()) continue;
    ++active;
    const size_t g = std::min(most_, b < room.size() ? room[b] : 0);
    if (g) wouldGuess_[b] = lookup_.guess(rows[b], g);
    // 1 + a + a^2 + ...: the drawn token, then each guess confirmed only if those before it were.
    double term = 1, rate = rates_[b].value();
    for (size_t i = 0; i <= wouldGuess_[b].size(); ++i, term *= rate) expected += term;
  }
  if (expected <= active) { // no row has a guess: a decode step
    sinceDecode_ = 0;
    return sent_;
  }
  expectedHeld_ = kCalibrationFade * expectedHeld_ + (1 - kCalibrationFade);
  held_ = kCalibrationFade * held_ + (1 - kCalibrationFade);
  const double calibration = held_ / expectedHeld_;
  bool verify;
  if (always_) verify = true;
  else if (verifyCost <= 0) verify = sinceDecode_ == 0; // one decode step timed, then a verify step
  else if (sinceDecode_ >= kRetimeEvery) verify = false; // the decode step's time moves with the context
  else verify = active + calibration * (expected - active) > active * verifyCost;
  sinceDecode_ = verify ? sinceDecode_ + 1 : 0;
  expectedNow_ = verify ? expected - active : 0;
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
