// Training checkpoints: DIR/checkpoint-<step>/ holds state.safetensors (every
// mutable global: parameters, optimizer moments, gradients, counters) and a
// manifest with a CRC32C per tensor and the loop position. Each checkpoint is
// built in a temp folder, its manifest written last, then renamed into place
// and the parent folder fsynced: a crash mid-save leaves the previous
// checkpoint as the newest valid one.
#pragma once
#include "sd/runtime/session.h"
#include <string>

namespace sd {

struct CheckpointMeta {
  int64_t step = 0;      // optimizer steps done
  int64_t epoch = 0;     // data position: epoch and index into its order
  int64_t position = 0;
  uint64_t seed = 0;     // data seed the order derives from
};

Status saveCheckpoint(const std::string &dir, const Session &session, const CheckpointMeta &meta, int keep = 2);
// Restores the newest checkpoint whose manifest and checksums verify; skips
// (and names in `notes`) broken ones. Error if none is valid.
StatusOr<CheckpointMeta> restoreLatestCheckpoint(const std::string &dir, Session &session, std::string &usedPath,
                                                 std::vector<std::string> &notes);

} // namespace sd
