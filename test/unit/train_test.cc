// The trainer's host-side pieces on their own: learning-rate schedules, data
// lines, the seeded order, the resumable cursor, the packer, token batches and
// the checkpoint manifest.
#include "../../runtime/train/checkpoint_manifest.h"
#include "sd/train/batching.h"
#include "sd/train/schedule.h"
#include <gtest/gtest.h>
#include <set>

namespace {

using namespace sd;
using namespace sd::train;

TEST(Schedule, WarmupThenConstantOrCosine) {
  LrSchedule s;
  s.peak = 1e-3;
  s.warmupSteps = 4;
  EXPECT_DOUBLE_EQ(learningRate(s, 0, 20), 0.0);
  EXPECT_DOUBLE_EQ(learningRate(s, 2, 20), 5e-4);
  EXPECT_DOUBLE_EQ(learningRate(s, 4, 20), 1e-3);
  EXPECT_DOUBLE_EQ(learningRate(s, 19, 20), 1e-3);
  s.kind = LrSchedule::Kind::Cosine;
  EXPECT_DOUBLE_EQ(learningRate(s, 4, 20), 1e-3);       // the peak right after warm-up
  EXPECT_NEAR(learningRate(s, 12, 20), 5e-4, 1e-12);    // halfway down
  EXPECT_NEAR(learningRate(s, 20, 20), 0.0, 1e-18);     // 0 at the end, never negative
  EXPECT_GE(learningRate(s, 25, 20), 0.0);
  EXPECT_TRUE(parseScheduleKind("cosine").isOk());
  auto bad = parseScheduleKind("linear");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("'linear'"), std::string::npos);
}

DatasetOptions options(int64_t vocab = 100, int64_t maxLength = 16) {
  DatasetOptions o;
  o.vocab = vocab;
  o.maxLength = maxLength;
  return o;
}

TEST(DataLines, IdsPromptCompletionAndErrors) {
  auto e = parseDataLine(R"({"input_ids": [5, 6, 7]})", "d.jsonl:1", options());
  ASSERT_TRUE(e.isOk()) << e.status().message();
  EXPECT_EQ(e.value().ids, (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(e.value().labels, (std::vector<int64_t>{5, 6, 7}));
  for (auto [line, needle] : {std::pair{R"({"input_ids": [5, 100]})", "d.jsonl:3"},
                              {R"({"input_ids": []})", "d.jsonl:3"},
                              {R"({"nothing": 1})", "input_ids"},
                              {R"({"input_ids": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]})", "d.jsonl:3"},
                              {"not json", "d.jsonl:3"}}) {
    auto bad = parseDataLine(line, "d.jsonl:3", options());
    ASSERT_FALSE(bad.isOk()) << line;
    EXPECT_NE(bad.status().message().find(needle), std::string::npos) << bad.status().message();
  }
  DatasetOptions cut = options();
  cut.truncate = true;
  auto longer = parseDataLine(R"({"input_ids": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18]})", "d:1", cut);
  ASSERT_TRUE(longer.isOk());
  EXPECT_EQ(longer.value().ids.size(), 16u);
}

TEST(DataOrder, SeededPermutationIsStableAndComplete) {
  auto a = shuffledOrder(50, 7), b = shuffledOrder(50, 7), c = shuffledOrder(50, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(std::set<size_t>(a.begin(), a.end()).size(), 50u);
  EXPECT_TRUE(shuffledOrder(0, 1).empty());
}

std::vector<Example> examples(std::vector<int> lengths) {
  std::vector<Example> out;
  for (size_t i = 0; i < lengths.size(); ++i) {
    Example e;
    e.ids.assign(size_t(lengths[i]), int64_t(i + 1));
    e.labels = e.ids;
    out.push_back(e);
  }
  return out;
}

TEST(DataCursor, ResumesOnTheSameExampleAndWrapsIntoANewOrder) {
  auto data = examples({3, 3, 3, 3, 3});
  DataCursor a{&data, true, 11, 0, 0, {}};
  a.reorder();
  std::vector<const Example *> seen;
  for (int i = 0; i < 7; ++i) seen.push_back(a.take());
  EXPECT_EQ(a.epoch, 1);
  EXPECT_EQ(a.index, 2);
  EXPECT_EQ(a.consumed(), 7);
  // A cursor rebuilt from the recorded position continues exactly there.
  DataCursor b{&data, true, 11, a.epoch, a.index, {}};
  b.reorder();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.take(), b.take());
  // Each epoch visits every example once.
  DataCursor c{&data, true, 11, 0, 0, {}};
  c.reorder();
  std::set<const Example *> epoch0;
  for (int i = 0; i < 5; ++i) epoch0.insert(c.take());
  EXPECT_EQ(epoch0.size(), 5u);
}

TEST(Packer, FirstFitDecreasingAndStreamPacking) {
  auto data = examples({6, 5, 4, 3, 2, 7});
  std::vector<const Example *> ptrs;
  for (auto &e : data) ptrs.push_back(&e);
  Rows rows;
  ASSERT_TRUE(firstFitDecreasing({ptrs[0], ptrs[1], ptrs[2], ptrs[3]}, 2, 10, rows)); // 6+4, 5+3
  size_t used = 0;
  for (auto &r : rows) {
    size_t n = 0;
    for (auto *e : r) n += e->ids.size();
    EXPECT_LE(n, 10u);
    used += r.size();
  }
  EXPECT_EQ(used, 4u);
  EXPECT_FALSE(firstFitDecreasing({ptrs[0], ptrs[5]}, 1, 10, rows)); // 6 + 7 > 10

  // The stream packer takes the longest prefix that fits: 6, 5, 4, 3 (18 <= 2 x 10), not the 2 after it? 20 fits too.
  size_t next = 0;
  Rows packed = packRows(2, 10, true, [&] { return next < ptrs.size() ? ptrs[next] : nullptr; },
                         [&] { return ptrs[next++]; });
  size_t tokens = 0, count = 0;
  for (auto &r : packed)
    for (auto *e : r) tokens += e->ids.size(), ++count;
  EXPECT_EQ(count, next);     // exactly the examples it consumed
  EXPECT_EQ(tokens, 20u);     // 6+5+4+3+2: the 7 after them no longer fits
  next = 0;
  Rows padded = packRows(2, 10, false, [&] { return next < ptrs.size() ? ptrs[next] : nullptr; },
                         [&] { return ptrs[next++]; });
  EXPECT_EQ(padded.size(), 2u);
  EXPECT_EQ(next, 2u);
}

TEST(TokenBatch, PadsAndMasksPackedBoundaries) {
  auto data = examples({3, 2});
  Rows rows = {{&data[0], &data[1]}};
  TokenBatch tb(rows, 2, 6, "input_ids");
  const int64_t *ids = reinterpret_cast<const int64_t *>(tb.ids.data.data());
  const int64_t *labels = reinterpret_cast<const int64_t *>(tb.labels.data.data());
  const int64_t *pos = reinterpret_cast<const int64_t *>(tb.positions.data.data());
  EXPECT_EQ(tb.ids.dims, (Dims{2, 6}));
  EXPECT_EQ((std::vector<int64_t>(ids, ids + 6)), (std::vector<int64_t>{1, 1, 1, 2, 2, 0}));
  // The packed second example's first label would be predicted from the first one's last token.
  EXPECT_EQ((std::vector<int64_t>(labels, labels + 6)), (std::vector<int64_t>{1, 1, 1, kIgnoreLabel, 2, kIgnoreLabel}));
  EXPECT_EQ((std::vector<int64_t>(pos, pos + 5)), (std::vector<int64_t>{0, 1, 2, 0, 1}));
  for (int i = 6; i < 12; ++i) EXPECT_EQ(labels[i], kIgnoreLabel); // the padding row trains on nothing
}

TEST(DataLines, PreferencePairs) {
  DatasetOptions pairs = options();
  pairs.pairs = true;
  auto e = parseDataLine(R"({"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5]})", "p:1", pairs);
  ASSERT_TRUE(e.isOk()) << e.status().message();
  EXPECT_EQ(e.value().ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(e.value().labels, (std::vector<int64_t>{kIgnoreLabel, kIgnoreLabel, 3}));
  EXPECT_EQ(e.value().rejectedIds, (std::vector<int64_t>{1, 2, 4, 5}));
  EXPECT_EQ(e.value().rejectedLabels, (std::vector<int64_t>{kIgnoreLabel, kIgnoreLabel, 4, 5}));
  EXPECT_EQ(e.value().length(), 4u);
  // Text as bytes (a 256-token plan): each completion after the prompt.
  auto text = parseDataLine(R"({"prompt": "ab", "chosen": "c", "rejected": "de"})", "p:2", options(256));
  ASSERT_FALSE(text.isOk()); // not a preference plan: 'chosen' is refused
  EXPECT_NE(text.status().message().find("--recipe dpo"), std::string::npos) << text.status().message();
  DatasetOptions bytes = options(256);
  bytes.pairs = true;
  text = parseDataLine(R"({"prompt": "ab", "chosen": "c", "rejected": "de"})", "p:2", bytes);
  ASSERT_TRUE(text.isOk()) << text.status().message();
  EXPECT_EQ(text.value().ids, (std::vector<int64_t>{'a', 'b', 'c'}));
  EXPECT_EQ(text.value().rejectedLabels, (std::vector<int64_t>{kIgnoreLabel, kIgnoreLabel, 'd', 'e'}));
  for (auto [line, needle] : {std::pair{R"({"prompt_ids": [1], "chosen_ids": [2]})", "'rejected_ids'"},
                              {R"({"input_ids": [1, 2]})", "not a field of preference data"},
                              {R"({"prompt_ids": [1], "chosen_ids": [], "rejected_ids": [2]})", "no tokens"},
                              {R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [200]})", "'rejected_ids'[0]"}}) {
    auto bad = parseDataLine(line, "p:3", pairs);
    ASSERT_FALSE(bad.isOk()) << line;
    EXPECT_NE(bad.status().message().find(needle), std::string::npos) << bad.status().message();
    EXPECT_EQ(bad.status().message().rfind("p:3: ", 0), 0u) << bad.status().message();
  }
}

TEST(TokenBatch, PairsFillTwoRowsEach) {
  DatasetOptions pairs = options();
  pairs.pairs = true;
  auto e = parseDataLine(R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3, 4]})", "p:1", pairs);
  ASSERT_TRUE(e.isOk());
  Rows rows = {{&e.value()}};
  TokenBatch tb(rows, 4, 3, "input_ids", RowLayout::Pairs);
  const int64_t *ids = reinterpret_cast<const int64_t *>(tb.ids.data.data());
  const int64_t *labels = reinterpret_cast<const int64_t *>(tb.labels.data.data());
  // Row 0 the chosen sequence, row 1 the rejected one, rows 2-3 (a missing pair) train on nothing.
  EXPECT_EQ((std::vector<int64_t>(ids, ids + 6)), (std::vector<int64_t>{1, 2, 0, 1, 3, 4}));
  EXPECT_EQ((std::vector<int64_t>(labels, labels + 6)), (std::vector<int64_t>{kIgnoreLabel, 2, kIgnoreLabel,
                                                                               kIgnoreLabel, 3, 4}));
  for (int i = 6; i < 12; ++i) EXPECT_EQ(labels[i], kIgnoreLabel);
}

TEST(DataLines, UnpairedExamples) {
  DatasetOptions kto = options();
  kto.pairs = kto.unpaired = true;
  auto e = parseDataLine(R"({"prompt_ids": [1, 2], "completion_ids": [3, 4], "label": false})", "k:1", kto);
  ASSERT_TRUE(e.isOk()) << e.status().message();
  EXPECT_EQ(e.value().ids, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(e.value().labels, (std::vector<int64_t>{kIgnoreLabel, kIgnoreLabel, 3, 4}));
  EXPECT_EQ(e.value().promptLength, 2);
  EXPECT_EQ(e.value().label, 0);
  DatasetOptions bytes = options(256);
  bytes.pairs = bytes.unpaired = true;
  auto text = parseDataLine(R"({"prompt": "ab", "completion": "c", "label": true})", "k:2", bytes);
  ASSERT_TRUE(text.isOk()) << text.status().message();
  EXPECT_EQ(text.value().ids, (std::vector<int64_t>{'a', 'b', 'c'}));
  EXPECT_EQ(text.value().promptLength, 2);
  EXPECT_EQ(text.value().label, 1);
  for (auto [line, needle] : {std::pair{R"({"prompt_ids": [1], "completion_ids": [2]})", "'label'"},
                              {R"({"prompt_ids": [1], "completion_ids": [2], "label": 1})", "true (desirable) or false"},
                              {R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]})", "not a field"},
                              {R"({"prompt_ids": [1], "completion_ids": [], "label": true})", "no tokens"},
                              {R"({"prompt": "a", "label": true})", "'completion'"}}) {
    auto bad = parseDataLine(line, "k:3", kto);
    ASSERT_FALSE(bad.isOk()) << line;
    EXPECT_NE(bad.status().message().find(needle), std::string::npos) << bad.status().message();
    EXPECT_EQ(bad.status().message().rfind("k:3: ", 0), 0u) << bad.status().message();
  }
}

TEST(TokenBatch, UnpairedExamplesGetKlRowsOfTheRotatedCompletions) {
  DatasetOptions kto = options();
  kto.pairs = kto.unpaired = true;
  auto a = parseDataLine(R"({"prompt_ids": [1], "completion_ids": [2, 3], "label": true})", "k:1", kto);
  auto b = parseDataLine(R"({"prompt_ids": [4, 5], "completion_ids": [6], "label": false})", "k:2", kto);
  ASSERT_TRUE(a.isOk() && b.isOk());
  Rows rows = {{&a.value()}, {&b.value()}};
  TokenBatch tb(rows, 6, 4, "input_ids", RowLayout::Unpaired);
  const int64_t *ids = reinterpret_cast<const int64_t *>(tb.ids.data.data());
  const int64_t *labels = reinterpret_cast<const int64_t *>(tb.labels.data.data());
  const int64_t *desirable = reinterpret_cast<const int64_t *>(tb.desirable.data.data());
  // Row 0 example a, row 1 a's prompt with b's completion (the last example's
  // for the first), row 2 example b, row 3 b's prompt with a's completion.
  EXPECT_EQ((std::vector<int64_t>(ids, ids + 16)),
            (std::vector<int64_t>{1, 2, 3, 0, 1, 6, 0, 0, 4, 5, 6, 0, 4, 5, 2, 3}));
  const int64_t x = kIgnoreLabel;
  EXPECT_EQ((std::vector<int64_t>(labels, labels + 16)),
            (std::vector<int64_t>{x, 2, 3, x, x, 6, x, x, x, x, 6, x, x, x, 2, 3}));
  EXPECT_EQ((std::vector<int64_t>(desirable, desirable + 6)), (std::vector<int64_t>{1, 1, 0, 0, x, x}));
  EXPECT_EQ(tb.inputs().count("desirable"), 1u);
  // A KL row longer than the bucket is cut at its end.
  TokenBatch cut(rows, 4, 3, "input_ids", RowLayout::Unpaired);
  const int64_t *cutIds = reinterpret_cast<const int64_t *>(cut.ids.data.data());
  EXPECT_EQ((std::vector<int64_t>(cutIds + 9, cutIds + 12)), (std::vector<int64_t>{4, 5, 2}));
}

TEST(DataLines, ScoredGroups) {
  DatasetOptions grpo = options();
  grpo.groupSize = 2;
  auto e = parseDataLine(R"({"prompt_ids": [1, 2], "completion_ids": [[3], [4, 5]], "rewards": [1, -0.5]})", "g:1",
                         grpo);
  ASSERT_TRUE(e.isOk()) << e.status().message();
  const int64_t x = kIgnoreLabel;
  EXPECT_EQ(e.value().groupIds, (std::vector<std::vector<int64_t>>{{1, 2, 3}, {1, 2, 4, 5}}));
  EXPECT_EQ(e.value().groupLabels, (std::vector<std::vector<int64_t>>{{x, x, 3}, {x, x, 4, 5}}));
  EXPECT_EQ(e.value().rewards, (std::vector<float>{1.0f, -0.5f}));
  EXPECT_EQ(e.value().length(), 4u);
  DatasetOptions bytes = options(256);
  bytes.groupSize = 2;
  auto text = parseDataLine(R"({"prompt": "ab", "completions": ["c", "de"], "rewards": [0, 1]})", "g:2", bytes);
  ASSERT_TRUE(text.isOk()) << text.status().message();
  EXPECT_EQ(text.value().groupIds[1], (std::vector<int64_t>{'a', 'b', 'd', 'e'}));
  auto sft = parseDataLine(R"({"prompt": "ab", "completions": ["c", "de"], "rewards": [0, 1]})", "g:3", options(256));
  ASSERT_FALSE(sft.isOk()); // not a GRPO plan
  EXPECT_NE(sft.status().message().find("--recipe grpo"), std::string::npos) << sft.status().message();
  for (auto [line, needle] :
       {std::pair{R"({"prompt_ids": [1], "completion_ids": [[2], [3]]})", "'rewards'"},
        {R"({"prompt_ids": [1], "completion_ids": [[2]], "rewards": [1]})", "2 completions, it has 1"},
        {R"({"prompt_ids": [1], "completion_ids": [[2], [3]], "rewards": [1, null]})", "'rewards'[1]"},
        {R"({"prompt_ids": [1], "completion_ids": [[2], [3]], "rewards": [1e300, 0]})", "not a finite number"},
        {R"({"prompt_ids": [1], "completion_ids": [[2], []], "rewards": [1, 0]})", "completion_ids[1] has no tokens"},
        {R"({"prompt_ids": [1], "completion_ids": [[2], [300]], "rewards": [1, 0]})", "'completion_ids[1]'[0]"},
        {R"({"prompt": "a", "completion_ids": [[2], [3]], "rewards": [1, 0]})", "not both"},
        {R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]})", "not a field of GRPO data"}}) {
    auto bad = parseDataLine(line, "g:4", grpo);
    ASSERT_FALSE(bad.isOk()) << line;
    EXPECT_NE(bad.status().message().find(needle), std::string::npos) << bad.status().message();
    EXPECT_EQ(bad.status().message().rfind("g:4: ", 0), 0u) << bad.status().message();
  }
}

TEST(TokenBatch, GroupsFillARowPerCompletionWithItsReward) {
  DatasetOptions grpo = options();
  grpo.groupSize = 2;
  auto e = parseDataLine(R"({"prompt_ids": [1], "completion_ids": [[2], [3, 4]], "rewards": [0.25, -1]})", "g:1",
                         grpo);
  ASSERT_TRUE(e.isOk());
  Rows rows = {{&e.value()}};
  TokenBatch tb(rows, 4, 3, "input_ids", RowLayout::Groups);
  const int64_t *ids = reinterpret_cast<const int64_t *>(tb.ids.data.data());
  const int64_t *labels = reinterpret_cast<const int64_t *>(tb.labels.data.data());
  const float *rewards = reinterpret_cast<const float *>(tb.rewards.data.data());
  const int64_t x = kIgnoreLabel;
  // Rows 0-1 the group's completions after its prompt, rows 2-3 (a missing group) train on nothing.
  EXPECT_EQ((std::vector<int64_t>(ids, ids + 6)), (std::vector<int64_t>{1, 2, 0, 1, 3, 4}));
  EXPECT_EQ((std::vector<int64_t>(labels, labels + 12)), (std::vector<int64_t>{x, 2, x, x, 3, 4, x, x, x, x, x, x}));
  EXPECT_EQ(tb.rewards.dtype, DType::F32);
  EXPECT_EQ((std::vector<float>(rewards, rewards + 4)), (std::vector<float>{0.25f, -1.0f, 0.0f, 0.0f}));
  EXPECT_EQ(tb.inputs().count("rewards"), 1u);
  EXPECT_EQ(tb.inputs().count("old_log_probs"), 0u);
  // With the sampling policy's log-probabilities: position t holds token t + 1's.
  grpo.samplingLogProbs = true;
  auto s = parseDataLine(
      R"({"prompt_ids": [1], "completion_ids": [[2], [3, 4]], "rewards": [0, 1], "completion_logps": [[-0.5], [-1, -2]]})",
      "g:2", grpo);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  Rows sampled = {{&s.value()}};
  TokenBatch lp(sampled, 2, 3, "input_ids", RowLayout::Groups);
  const float *old = reinterpret_cast<const float *>(lp.oldLogProbs.data.data());
  EXPECT_EQ(lp.oldLogProbs.dims, (Dims{2, 3}));
  EXPECT_EQ((std::vector<float>(old, old + 6)), (std::vector<float>{-0.5f, 0.0f, 0.0f, -1.0f, -2.0f, 0.0f}));
}

TEST(CheckpointManifest, RoundTripAndChecks) {
  checkpoint::Manifest m;
  m.meta.runId = "00112233aabbccdd";
  m.meta.step = 5;
  m.meta.totalSteps = 10;
  m.meta.position = 12;
  m.meta.run = {{"seed", "3"}};
  m.worldSize = 2;
  m.files = {{"state-rank0-of-2.safetensors", {0, 100, 7}}, {"state-rank1-of-2.safetensors", {1, 90, 8}}};
  m.tensors["w"] = {{"state-rank0-of-2.safetensors", 0, 16, 1}, {"state-rank1-of-2.safetensors", 16, 16, 2}};
  const std::string text = checkpoint::manifestText(m);
  auto back = checkpoint::parseManifest(text, "m");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value().worldSize, 2);
  EXPECT_EQ(back.value().meta.run.at("seed"), "3");
  ASSERT_EQ(back.value().tensors.at("w").size(), 2u);
  EXPECT_EQ(back.value().tensors.at("w")[1].firstRow, 16);
  EXPECT_EQ(back.value().files.at("state-rank1-of-2.safetensors").crc, 8u);

  std::string flipped = text;
  flipped[flipped.find("\"step\":5") + 7] = '6';
  EXPECT_NE(checkpoint::parseManifest(flipped, "m").status().message().find("checksum"), std::string::npos);
  // A piece naming a file outside the set, or a path, is malformed even when re-signed.
  for (const std::string &file : {std::string("other.safetensors"), std::string("../x")}) {
    checkpoint::Manifest bad = m;
    bad.tensors["w"][0].file = file;
    if (file[0] == '.') bad.files[file] = {0, 1, 1};
    auto r = checkpoint::parseManifest(checkpoint::manifestText(bad), "m");
    ASSERT_FALSE(r.isOk()) << file;
    EXPECT_NE(r.status().message().find("malformed manifest"), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(checkpoint::stateFileName(0, 1), "state.safetensors");
  EXPECT_EQ(checkpoint::stateFileName(2, 3), "state-rank2-of-3.safetensors");
}

} // namespace
