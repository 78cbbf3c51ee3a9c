// The adapter slots of a plan compiled with sdc --max-loras N (sd-lora-slots):
// each LoRA factor is a stack of N + 1 slots, A [slot, in, r] and
// B [slot, r, out], and each row of a generation call names its slot
// (lora_ids). Slot 0 is the plan's own adapter (zeros: the base model, or
// what --adapter loads); the others hold whatever adapters are written there.
//
// An adapter is a PEFT LoRA folder (adapter_config.json and
// adapter_model.safetensors). Reading it checks it against the plan and makes
// each factor the slot's layout: transposed, zero-padded from its rank to the
// plan's, and its scale (lora_alpha / r, or / sqrt(r) with use_rslora) over
// the plan's folded into B, so adapters of different ranks, alphas and target
// modules (a subset of the plan's; the others stay zero) share the stacks.
#pragma once
#include "sd/format/peft.h"
#include "sd/runtime/session.h"
#include <memory>
#include <string>
#include <vector>

namespace sd {

// One adapter read for the slots: per stack (in LoraSlots order) the floats
// of one slot.
struct SlotAdapter {
  std::string dir;
  std::vector<std::vector<float>> factors;
};

class LoraSlots {
public:
  // An error when the plan has no adapter slots (not compiled with --max-loras).
  static StatusOr<std::unique_ptr<LoraSlots>> create(Session &session);
  // Slots besides slot 0 (the plan's --max-loras).
  int64_t count() const { return count_; }
  // Reads and checks the PEFT LoRA adapter in `dir`; nothing is written.
  StatusOr<SlotAdapter> read(const std::string &dir) const;
  // Puts `adapter` into `slot` (0 to count()).
  Status write(int64_t slot, const SlotAdapter &adapter);

private:
  struct Stack {
    size_t global = 0;
    std::string module;
    bool isA = true;         // A [slot, in, r], else B [slot, r, out]
    int64_t rows = 0, cols = 0; // one slot's [rows, cols]
  };
  LoraSlots(Session &s, LoraConfig cfg) : session_(s), cfg_(std::move(cfg)) {}

  Session &session_;
  LoraConfig cfg_;
  int64_t count_ = 0;
  std::vector<Stack> stacks_;
};

// The plan's adapter slots besides slot 0 (its --max-loras), 0 for none.
int64_t loraSlotCount(const Plan &plan);

} // namespace sd
