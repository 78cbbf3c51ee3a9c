// LoRA adapters between a session and PEFT-layout folders (sd/format/peft.h).
#pragma once
#include "sd/format/peft.h"
#include "sd/runtime/session.h"
#include <string>

namespace sd {

// The LoRA configuration a plan was compiled with (from its config JSON).
inline StatusOr<LoraConfig> loraConfigOf(const Plan &plan) { return loraConfigFromPlanConfig(plan.config); }
Status saveAdapter(const std::string &dir, const Session &session, const LoraConfig &cfg);
// Checks rank, alpha and modules against the plan, every shape, and that no
// tensor is missing or extra, before writing anything into the session.
Status loadAdapter(const std::string &dir, Session &session, const LoraConfig &cfg);

} // namespace sd
