// Training checkpoints: DIR/checkpoint-<step>/ holds state.safetensors (every
// mutable global: parameters, optimizer moments, gradients, counters) and
// manifest.json: the run's id, the loop position, the run parameters that
// position depends on, the size and CRC32C of the state file and of each
// tensor, and a CRC32C of the manifest itself. A checkpoint is built in a temp
// folder, manifest last, and put in place by one rename (docs/reliability.md).
//
// A folder belongs to one run at a time: the run holds DIR/.lock while it
// writes, a fresh run refuses a folder that already holds checkpoints, and
// pruning only removes older verified checkpoints of the writing run.
#pragma once
#include "sd/format/file_io.h"
#include "sd/runtime/session.h"
#include <map>
#include <string>
#include <vector>

namespace sd {

struct CheckpointMeta {
  std::string runId;  // 16 hex digits, made when a run starts fresh
  int64_t step = 0;   // optimizer steps done
  int64_t totalSteps = 0;
  int64_t epoch = 0;  // data position: epoch and index into its order
  int64_t position = 0;
  // What the data position means, by the flag that sets it ("--seed",
  // "--data", ...): a resume with other values would continue somewhere else.
  std::map<std::string, std::string> run;
};

// Values of globals this rank does not hold (sdc compile --shard), by global
// index: gathered before a save, handed out after a restore.
using GlobalValues = std::map<size_t, std::vector<uint8_t>>;

std::string newRunId();
// Verifies a manifest's own checksum and fields (no files are read).
StatusOr<CheckpointMeta> parseCheckpointManifest(const std::string &text, const std::string &what);

class CheckpointFolder {
public:
  // Creates DIR if needed, locks it (a second writer gets an error) and
  // removes temp folders left by killed runs.
  static StatusOr<CheckpointFolder> open(const std::string &dir);
  // For a run that starts fresh: error if DIR holds any checkpoint.
  Status requireNoCheckpoints() const;
  // Every mutable global, from the session or (those it does not hold) from `heldElsewhere`.
  Status save(const Session &session, const CheckpointMeta &meta, int keep, const GlobalValues *heldElsewhere = nullptr);
  // Restores the newest checkpoint that verifies; skipped broken ones are
  // named in `notes`. Error if none is valid. Nothing is written to the
  // session unless every check passed.
  // Values of globals the session does not hold go to `heldElsewhere` (an error when it is null).
  StatusOr<CheckpointMeta> restoreLatest(Session &session, std::string &usedPath, std::vector<std::string> &notes,
                                         GlobalValues *heldElsewhere = nullptr) const;
  const std::string &path() const { return dir_; }

private:
  std::string dir_;
  DirectoryLock lock_;
  std::map<std::string, bool> verified_; // folder -> verified as this run's, for pruning
};

} // namespace sd
