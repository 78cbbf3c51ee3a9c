// GRPO's online half (sdrun train --reward-cmd): each step's groups are
// sampled from the plan being trained, through its key/value-cache decode
// entries (sdc compile --recipe grpo --kv-cache), and scored by the user's
// reward command, as TRL's GRPOTrainer samples with the policy and calls its
// reward functions. The loss then runs on them as on scored data lines.
#pragma once
#include "sd/runtime/session.h"
#include "sd/train/dataset.h"
#include <functional>
#include <memory>
#include <string>
#include <sys/types.h>
#include <vector>

namespace sd::train {

// `/bin/sh -c COMMAND`, started once and kept running (it may load a model
// once). For each completion it reads one JSON line on stdin, {"prompt":
// TEXT, "completion": TEXT, "prompt_ids": [...], "completion_ids": [...]},
// and writes one line back: the completion's reward, a finite number. A
// command that exits, writes something else, or stays silent for
// `timeoutSeconds` is an error naming the completion; it never stops us.
class RewardCommand {
public:
  static StatusOr<std::unique_ptr<RewardCommand>> start(const std::string &command, double timeoutSeconds);
  ~RewardCommand(); // closes its stdin, then waits for it (killed when it does not exit)
  RewardCommand(const RewardCommand &) = delete;
  RewardCommand &operator=(const RewardCommand &) = delete;
  // One reward per line of `requests` (each a JSON object, no newline).
  StatusOr<std::vector<float>> score(const std::vector<std::string> &requests);

private:
  RewardCommand(std::string command, double timeout) : command_(std::move(command)), timeout_(timeout) {}
  Status readLine(std::string &line, size_t index);
  std::string command_;
  double timeout_;
  pid_t pid_ = -1;
  int toChild_ = -1, fromChild_ = -1;
  std::string buffered_; // read from the command, not yet a whole line
  size_t scored_ = 0;    // completions scored so far, for errors
};

// Rewards for completions, one per request ({"prompt", "completion",
// "prompt_ids", "completion_ids"} JSON objects), in order.
using RewardFunction = std::function<StatusOr<std::vector<float>>(const std::vector<std::string> &requests)>;

struct RolloutOptions {
  std::string rewardCommand;    // a RewardCommand to start
  RewardFunction rewardFunction; // or this (the C API's and Python's callbacks); neither: the data holds scored groups
  double rewardTimeoutSeconds = 600;
  int64_t maxNewTokens = 0;     // 0: as many as the plan's row holds after the prompt
  double temperature = 1.0, topP = 1.0; // TRL's GRPOConfig defaults
  int64_t topK = 0;             // 0: the whole vocabulary
};

// Gives each prompt example of `examples` (ids: the prompt) its group:
// `groupSize` completions sampled from `session` (a plan with prefill and
// decode entries) with `seed`, each up to `rowLength` tokens with its prompt,
// ending at the tokenizer's EOS (kept, as TRL keeps it) or at the limit; then
// scored by `reward`. `rewardSum` gains the rewards' sum.
Status sampleGroups(Session &session, const RolloutOptions &options, uint64_t seed, int64_t groupSize,
                    int64_t rowLength, const Tokenizer *tokenizer, const RewardFunction &reward,
                    std::vector<Example> &examples, double &rewardSum);

} // namespace sd::train
