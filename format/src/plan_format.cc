// Global role names and their tie to the FlatBuffer schema's numbering.
#include "sd/format/plan_format.h"
#include "plan_generated.h"

namespace sd {

static_assert(uint8_t(GlobalRole::Statistics) == uint8_t(fb::GlobalRole::MAX) && kGlobalRoleCount == int(fb::GlobalRole::MAX) + 1,
              "GlobalRole must list schema/plan.fbs's roles in order");
static_assert(uint8_t(GlobalRole::Trainable) == uint8_t(fb::GlobalRole::Trainable) &&
              uint8_t(GlobalRole::OptimizerState) == uint8_t(fb::GlobalRole::OptimizerState) &&
              uint8_t(GlobalRole::ScalarState) == uint8_t(fb::GlobalRole::ScalarState) &&
              uint8_t(GlobalRole::Constant) == uint8_t(fb::GlobalRole::Constant) &&
              uint8_t(GlobalRole::Gradient) == uint8_t(fb::GlobalRole::Gradient) &&
                  uint8_t(GlobalRole::KvCache) == uint8_t(fb::GlobalRole::KvCache) &&
                  uint8_t(GlobalRole::Statistics) == uint8_t(fb::GlobalRole::Statistics),
              "GlobalRole numbering differs from schema/plan.fbs");

const char *globalRoleName(GlobalRole r) {
  switch (r) {
  case GlobalRole::Frozen: return "frozen";
  case GlobalRole::Trainable: return "trainable";
  case GlobalRole::OptimizerState: return "optimizer_state";
  case GlobalRole::ScalarState: return "scalar_state";
  case GlobalRole::Constant: return "constant";
  case GlobalRole::Gradient: return "gradient";
  case GlobalRole::KvCache: return "kv_cache";
  case GlobalRole::Statistics: return "statistics";
  }
  return "unknown";
}

std::optional<GlobalRole> globalRoleFromByte(uint8_t raw) {
  if (raw >= kGlobalRoleCount) return std::nullopt;
  return GlobalRole(raw);
}

std::optional<GlobalRole> parseGlobalRole(std::string_view name) {
  for (int i = 0; i < kGlobalRoleCount; ++i)
    if (name == globalRoleName(GlobalRole(i))) return GlobalRole(i);
  return std::nullopt;
}

} // namespace sd
