// Speculative decoding: guesses by prompt lookup (sd/generate/prompt_lookup.h)
// and when a step checks them (sd/generate/speculation.h).
#include "sd/generate/prompt_lookup.h"
#include "sd/generate/speculation.h"
#include <gtest/gtest.h>

using sd::generate::PromptLookup;
using Tokens = std::vector<int64_t>;

TEST(PromptLookup, NothingWhenNoEndingRecurs) {
  const PromptLookup lookup;
  EXPECT_TRUE(lookup.guess({1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(lookup.guess({1}, 4).empty());
  EXPECT_TRUE(lookup.guess({}, 4).empty());
  EXPECT_TRUE(lookup.guess({1, 2, 1}, 0).empty()); // none asked for
}

TEST(PromptLookup, WhatFollowedTheEndingBefore) {
  const PromptLookup lookup;
  // "1 2" ends the text and occurred at 0, followed by 3 9.
  EXPECT_EQ(lookup.guess({1, 2, 3, 9, 1, 2}, 2), (Tokens{3, 9}));
  EXPECT_EQ(lookup.guess({1, 2, 3, 9, 1, 2}, 1), (Tokens{3}));
}

TEST(PromptLookup, TheLatestOccurrence) {
  const PromptLookup lookup;
  // "5 1" came before 7, then before 8: the latest continuation is guessed.
  EXPECT_EQ(lookup.guess({5, 1, 7, 5, 1, 8, 5, 1}, 2), (Tokens{8, 5}));
}

TEST(PromptLookup, TheLongestEndingFirst) {
  const PromptLookup lookup;
  // "2 3" last went on with 9, but "1 2 3" (longer) went on with 4.
  EXPECT_EQ(lookup.guess({1, 2, 3, 4, 2, 3, 9, 1, 2, 3}, 2), (Tokens{4, 2}));
  PromptLookup pairs;
  pairs.maxNgram = 2;
  EXPECT_EQ(pairs.guess({1, 2, 3, 4, 2, 3, 9, 1, 2, 3}, 2), (Tokens{9, 1}));
}

TEST(PromptLookup, TheShortestEndingTried) {
  PromptLookup lookup;
  EXPECT_EQ(lookup.guess({4, 6, 8, 6}, 1), (Tokens{8}));
  lookup.minNgram = 2; // a single recurring token is not enough
  EXPECT_TRUE(lookup.guess({4, 6, 8, 6}, 1).empty());
}

TEST(PromptLookup, ARepeatGoesOnPastTheEnd) {
  const PromptLookup lookup;
  EXPECT_EQ(lookup.guess({7, 7, 7}, 4), (Tokens{7, 7, 7, 7}));
  // "x y x y": the repeat continues with period 2.
  EXPECT_EQ(lookup.guess({3, 1, 2, 1, 2}, 5), (Tokens{1, 2, 1, 2, 1}));
}

// When a step guesses (sd/generate/speculation.h).
using sd::generate::Speculator;

namespace {
const Tokens kRepeating = {1, 2, 3, 1, 2, 3, 1, 2}; // prompt lookup guesses 3 1 2 3 ...
}

TEST(Speculator, TriesEachEntryWhileTheirCostsAreUnknown) {
  Speculator s(4, 1);
  EXPECT_EQ(s.guess({kRepeating}, {8}, 0).value(), (std::vector<Tokens>{{3, 1, 2, 3}})); // a verify step, to time it
  s.drawn({{3, 1, 2, 3, 1}});
  EXPECT_EQ(s.guess({kRepeating}, {8}, 0).value(), (std::vector<Tokens>{{}})); // then a decode step
  EXPECT_EQ(s.guessed(), 4u);
  EXPECT_EQ(s.confirmed(), 4u);
}

TEST(Speculator, GuessesOnlyWhenExpectedToPay) {
  Speculator s(4, 1);
  // The prior rate (one in two) expects 1 + 1/2 + ... + 1/16 < 2 tokens a step.
  EXPECT_EQ(s.guess({kRepeating}, {8}, 2.5).value(), (std::vector<Tokens>{{}}));
  EXPECT_EQ(s.guess({kRepeating}, {8}, 1.2).value(), (std::vector<Tokens>{{3, 1, 2, 3}}));
  // Nor beyond a row's room, nor for idle rows.
  Speculator two(4, 2);
  EXPECT_EQ(two.guess({kRepeating, {}}, {2, 0}, 1.2).value(), (std::vector<Tokens>{{3, 1}, {}}));
}

TEST(Speculator, LearnsFromDecodeStepsToo) {
  Speculator s(4, 1);
  // At this cost the prior does not pay; each decode step's token was the
  // guess, though, until the rate says it pays.
  int steps = 0;
  while (s.guess({kRepeating}, {8}, 3.5).value().front().empty() && steps < 20) {
    s.drawn({{3}});
    ++steps;
  }
  EXPECT_GT(steps, 0);
  EXPECT_LT(steps, 20);
  EXPECT_EQ(s.guessed(), 0u); // counts are of checked guesses
  s.drawn({{3, 9}});          // one held, the second did not
  EXPECT_EQ(s.guessed(), 4u);
  EXPECT_EQ(s.confirmed(), 1u);
  s.restart(0); // a new text: back to the prior
  EXPECT_EQ(s.guess({kRepeating}, {8}, 3.5).value(), (std::vector<Tokens>{{}}));
}
