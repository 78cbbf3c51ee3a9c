// Learning-rate schedules.
#include "sd/train/schedule.h"
#include <algorithm>
#include <cmath>

namespace sd::train {

StatusOr<LrSchedule::Kind> parseScheduleKind(const std::string &name) {
  if (name == "constant") return LrSchedule::Kind::Constant;
  if (name == "cosine") return LrSchedule::Kind::Cosine;
  return sdError("the learning-rate schedule takes 'constant' or 'cosine', got '", name, "'");
}

double learningRate(const LrSchedule &s, int64_t step, int64_t total) {
  if (s.warmupSteps > 0 && step < s.warmupSteps) return s.peak * double(step) / double(s.warmupSteps);
  if (s.kind != LrSchedule::Kind::Cosine) return s.peak;
  double progress = double(step - s.warmupSteps) / double(std::max<int64_t>(1, total - s.warmupSteps));
  return s.peak * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
}

} // namespace sd::train
