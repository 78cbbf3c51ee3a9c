// The training loop behind `sdrun train`.
#pragma once
#include "sd/runtime/plan.h"
#include "sd/format/tensor_io.h"
#include <cstdint>
#include <string>

namespace sdrun {

struct TrainOptions {
  std::string planPath, dataPath, evalPath, checkpointDir, saveWeights, metricsPath;
  std::string adapterIn, adapterOut; // --adapter / --save-adapter (PEFT layout)
  std::string schedule = "constant"; // constant | cosine
  bool shuffle = true, truncate = false, resume = false;
  int64_t steps = 0, epochs = 1, batch = 0, gradAccum = 1, warmupSteps = 0;
  int64_t evalEvery = 0, checkpointEvery = 0, threads = 0;
  double lr = 1e-4, weightDecay = 0, clipNorm = 0;
  uint64_t seed = 0;
};

sd::Status runTraining(const TrainOptions &o);

// Inputs for one call of a training entry (train_step, accumulate, eval_step,
// apply) from the first `batch` examples of a JSONL file, in the entry's
// input order (lr 1e-4, no weight decay or clipping): for `sdrun bench`.
sd::Status trainInputsFromData(const sd::Plan &plan, size_t entry, const std::string &dataPath, int64_t batch,
                               std::vector<sd::HostTensor> &inputs);

// Learning rate of optimizer step `step` (0-based): constant, or linear
// warm-up to `peak` then cosine decay to 0 at `total` (HF's cosine schedule).
double learningRate(const TrainOptions &o, int64_t step, int64_t total);

} // namespace sdrun
