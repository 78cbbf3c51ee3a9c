// The plan file's constants and the one definition of global roles, shared by
// the compiler (which writes plans) and the runtime (which reads them).
// Layout: [FlatBuffer "SDPL" (schema/plan.fbs)][pad][weights, 64-byte aligned][footer].
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sd {

constexpr uint32_t kPlanSchemaMajor = 1;
// 1.1: Entry.tensor_bytes; 1.2: Gradient role, zero-initialized state;
// 1.3: counted output extents (Binding.extent_buffer/extent_axis); 1.4: KvCache role;
// 1.5: Loop and If steps over body entries (Entry.body); 1.6: Statistics role;
// 1.7: files the plan carries (Plan.files: the model's tokenizer).
constexpr uint32_t kPlanSchemaMinor = 7;
constexpr char kPlanFooterMagic[4] = {'S', 'D', 'P', 'F'};
constexpr size_t kPlanFooterSize = 16; // u64 flatbuffer size, u32 crc32c, magic
constexpr size_t kWeightAlignment = 64;

// Numbered as schema/plan.fbs's GlobalRole (plan_format.cc checks it).
enum class GlobalRole : uint8_t {
  Frozen = 0,
  Trainable = 1,
  OptimizerState = 2,
  ScalarState = 3,
  Constant = 4,
  Gradient = 5,
  KvCache = 6, // generation state: written by prefill/decode, never checkpointed or synced across ranks
  Statistics = 7, // running statistics training entries update: checkpointed and saved with the weights, never optimized
};
constexpr int kGlobalRoleCount = 8;

// Roles whose values entries may write.
inline bool isMutableRole(GlobalRole r) { return r != GlobalRole::Frozen && r != GlobalRole::Constant; }
// Mutable roles that are training state: checkpoints save them and ranks keep
// them in step. A KV cache is neither: it belongs to one generation.
inline bool isTrainingStateRole(GlobalRole r) { return isMutableRole(r) && r != GlobalRole::KvCache; }
// The role's name in the sd dialect and in `sdrun inspect`: "frozen", "trainable", ...
const char *globalRoleName(GlobalRole r);
// The role called `name`; nullopt for anything else (an unknown role is an error, never frozen).
std::optional<GlobalRole> parseGlobalRole(std::string_view name);
// A role number read from a file: nullopt when out of range.
std::optional<GlobalRole> globalRoleFromByte(uint8_t raw);

} // namespace sd
