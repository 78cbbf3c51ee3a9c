// Learning-rate schedules, evaluated on the host once per optimizer step and
// fed to the plan's apply/train_step entry as its `lr` input.
#pragma once
#include "sd/format/status.h"
#include <cstdint>
#include <string>

namespace sd::train {

struct LrSchedule {
  enum class Kind { Constant, Cosine } kind = Kind::Constant;
  double peak = 1e-4;
  int64_t warmupSteps = 0;
};

// "constant" or "cosine"; anything else is an error naming the value.
StatusOr<LrSchedule::Kind> parseScheduleKind(const std::string &name);

// Learning rate of optimizer step `step` (0-based): linear warm-up to the peak,
// then constant, or cosine decay to 0 at `total` (HF's cosine schedule).
double learningRate(const LrSchedule &s, int64_t step, int64_t total);

} // namespace sd::train
