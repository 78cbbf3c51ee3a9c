// Speculative decoding's guesses by prompt lookup (sd/generate/prompt_lookup.h).
#include "sd/generate/prompt_lookup.h"
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
