// The trainer: drives a training plan's entries (train_step, or accumulate +
// apply, eval_step) over JSON Lines data, or over a folder of arrays for a
// plan with its own loss (tensor_data.h), on a session. The loop is branch-free
// on the plan side: the host picks a bucket, pads or packs the micro-batch,
// feeds lr / weight decay / clip as inputs and counts optimizer steps; eval and
// checkpoints happen at optimizer-step boundaries. sdrun train, the C API and
// the Python module all train through this class.
#pragma once
#include "sd/format/peft.h"
#include "sd/runtime/session.h"
#include "sd/train/batching.h"
#include "sd/train/rollout.h"
#include "sd/train/schedule.h"
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace sd::train {

struct TrainConfig {
  std::string planName; // names the plan in errors about it (its path); may be empty
  std::string dataPath, evalPath, checkpointDir;
  std::string adapterIn; // start from this LoRA adapter (PEFT layout); ignored when resuming
  std::string tokenizerPath; // a Hugging Face tokenizer (dir or tokenizer.json) for text lines
  LrSchedule schedule;
  bool shuffle = true, truncate = false, resume = false;
  int64_t steps = 0;  // optimizer steps; 0: `epochs` passes over the data
  int64_t epochs = 1;
  int64_t batch = 0;  // rows per micro-batch; 0: the plan's batch
  int64_t gradAccum = 1;
  int64_t evalEvery = 0, checkpointEvery = 0; // 0: only after the last step
  int checkpointsKept = 2;
  double weightDecay = 0, clipNorm = 0;
  uint64_t seed = 0; // data order and dropout masks
  // Data-parallel runs: after every step, check that all ranks hold bitwise
  // equal trainable parameters (a CRC32C per rank, compared on every rank).
  bool verifyReplicas = false;
  // Whether runStep() queues the next step before it waits for this one, so
  // the device never waits for the host between steps and a step's loss is
  // read one step behind. Never past a step whose eval, checkpoint or replica
  // check needs the state right after it, nor past the last; on several GPUs
  // never (the host's loss sum would race the next step's collectives).
  // WhenAsync: where the device runs apart from the host (a GPU). Always also
  // on the CPU, where it changes nothing but the order of work (for tests).
  // While a step runs ahead, evaluate() and the save calls are refused.
  enum class RunAhead { Never, WhenAsync, Always };
  RunAhead runAhead = RunAhead::Never;
  // GRPO plans: with a reward command, the data holds prompts and each step
  // samples its groups with the plan (seeded by seed, step and rank) and
  // scores them (rollout.h); steps never run ahead then.
  RolloutOptions rollout;
};

// What one optimizer step did (and the hooks that ran after it).
struct StepReport {
  int64_t step = 0, total = 0, epoch = 0; // step: optimizer steps done, 1-based
  double loss = 0, lr = 0, gradNorm = 0, tokens = 0;
  double seconds = 0, elapsedSeconds = 0; // this step; since the trainer's first step
  bool evaluated = false, checkpointed = false;
  double evalLoss = 0;
  // fp16 plans (dynamic loss scaling): `skipped` when the gradient held an
  // Inf or NaN, so parameters and optimizer state kept their values and the
  // scale halved; lossScale is the scale after this step (0: no loss scaling).
  bool skipped = false;
  double lossScale = 0;
  // Sampled GRPO groups (TrainConfig::rollout): the step's mean reward; NaN otherwise.
  double meanReward = std::numeric_limits<double>::quiet_NaN();
};

class Trainer {
public:
  // Binds to `session` (which must outlive the trainer): finds the training
  // entries and buckets, loads the data, loads the adapter or restores the
  // newest valid checkpoint (skipped broken ones are listed in notes()).
  static StatusOr<std::unique_ptr<Trainer>> create(Session &session, const TrainConfig &config);
  ~Trainer();

  // Under mpirun the trainer is one rank of a data-parallel run over the
  // session's communicator: each global micro-batch holds batch x ranks rows,
  // this rank trains on its `batch` of them, the losses reported are the
  // global ones. Every rank writes and reads its own share of a checkpoint;
  // only rank 0 reads an adapter (the others start from rank 0's state, sent
  // to them) and writes weights and adapters.
  int rank() const;
  int worldSize() const;
  int64_t rowsPerRank() const; // rows of one micro-batch on one rank (--batch)
  // A classification plan, or one with its own loss over tensor data: a step counts examples, not tokens.
  bool countsExamples() const;
  int64_t step() const;       // optimizer steps done
  int64_t totalSteps() const; // steps a full run takes
  bool done() const { return step() >= totalSteps(); }
  const std::string &resumedFrom() const; // checkpoint folder, empty when not resumed
  const std::vector<std::string> &notes() const;

  // One optimizer step, then eval and checkpoint when due. A non-finite loss
  // is an error (nothing is saved for that step).
  StatusOr<StepReport> runStep();
  // Mean loss per counted token over the eval data (error without eval data).
  StatusOr<double> evaluate();
  Status saveCheckpoint(); // every rank writes its share; rank 0 commits the manifest
  // The trainable parameters and running statistics as safetensors, keyed by global name (rank 0).
  Status saveWeights(const std::string &path) const;
  // The LoRA adapter in PEFT's layout (error unless the plan is --peft lora; rank 0).
  Status saveAdapter(const std::string &dir) const;

private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Runs `trainer` to its last step, calling `onStep` after each (an error
// from it stops the run and is returned).
Status trainToEnd(Trainer &trainer, const std::function<Status(const StepReport &)> &onStep);

// Inputs for one call of a training entry (train_step, accumulate, eval_step,
// apply) from the first `batch` examples of a JSONL file (a tensor-data plan:
// the first batch of its data folder), in the entry's input order (lr 1e-4, no weight decay or clipping): for benchmarks.
Status trainInputsFromData(const Plan &plan, size_t entry, const std::string &dataPath, int64_t batch,
                           std::vector<HostTensor> &inputs);

} // namespace sd::train
