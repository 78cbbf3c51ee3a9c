// LoRA adapters between a session and PEFT-layout folders (sd/format/peft.h).
#pragma once
#include "sd/format/peft.h"
#include "sd/runtime/session.h"
#include <map>
#include <string>
#include <vector>

namespace sd {

// The LoRA configuration a plan was compiled with (from its config JSON).
inline StatusOr<LoraConfig> loraConfigOf(const Plan &plan) { return loraConfigFromPlanConfig(plan.config); }
// `gathered` (optional): whole values of the globals this rank does not hold
// whole (--shard params; sd::train::gatherToRankZero collects them).
Status saveAdapter(const std::string &dir, const Session &session, const LoraConfig &cfg,
                   const std::map<size_t, std::vector<uint8_t>> *gathered = nullptr);
// Checks rank, alpha and modules against the plan, every shape, and that no
// tensor is missing or extra, before writing anything into the session.
Status loadAdapter(const std::string &dir, Session &session, const LoraConfig &cfg);
// A DyLoRA plan (sdc compile --peft dylora): outside training, compute with
// the adapter's first `ranks` ranks only (a multiple of its block size, up to
// its r), as a LoRA of rank `ranks` cut from it would. An error on other plans.
Status setAdapterRank(Session &session, const LoraConfig &cfg, int64_t ranks);

} // namespace sd
