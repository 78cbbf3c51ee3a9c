// Training checkpoints: DIR/checkpoint-<step>/ holds the mutable globals
// (parameters, optimizer moments, gradients, counters) as one safetensors
// file per rank, each with the state that rank holds (its rows of weights
// split by rows, the optimizer state it owns; rank 0 also what every rank
// holds), and manifest.json: the run's id, the loop position, the run
// parameters that position depends on, the world size, each file's size and
// CRC32C, each tensor's pieces (file, first row, CRC32C), and a CRC32C of
// the manifest itself. A checkpoint is built in a temp folder, manifest last
// (written by rank 0 once every rank's file is in), and put in place by one
// rename (docs/reliability.md). A resume on another world size reads, on
// each rank, the pieces that overlap the rows it holds now.
//
// The folder must be one every rank reaches (a local disk for ranks on one
// machine, a shared file system across machines).
//
// A folder belongs to one run at a time: the run holds DIR/.lock while it
// writes, a fresh run refuses a folder that already holds checkpoints, and
// pruning only removes older verified checkpoints of the writing run.
#pragma once
#include "sd/format/file_io.h"
#include "sd/ops/communicator.h"
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

std::string newRunId();
// Verifies a manifest's own checksum and fields (no files are read).
StatusOr<CheckpointMeta> parseCheckpointManifest(const std::string &text, const std::string &what);

class CheckpointFolder {
public:
  // Every rank of a run opens it. Rank 0 creates DIR if needed, locks it (a
  // second writer gets an error) and removes temp folders left by killed
  // runs; the other ranks only name it.
  static StatusOr<CheckpointFolder> open(const std::string &dir, const Communicator *comm = nullptr);
  // Rank 0, for a run that starts fresh: error if DIR holds any checkpoint.
  Status requireNoCheckpoints() const;
  // Every rank of the session's world calls it: each writes the state it
  // holds, rank 0 commits the set and keeps the newest `keep` of this run.
  // All ranks return an error if any rank's part failed (nothing is committed then).
  Status save(const Session &session, const CheckpointMeta &meta, int keep);
  // Every rank calls it. Restores the newest checkpoint that verifies on
  // every rank; skipped broken ones are named in `notes` (on rank 0). Error
  // if none is valid. Nothing is written to the session unless every check
  // passed on every rank.
  StatusOr<CheckpointMeta> restoreLatest(Session &session, std::string &usedPath, std::vector<std::string> &notes) const;
  const std::string &path() const { return dir_; }

private:
  std::string dir_;
  DirectoryLock lock_;
  std::map<std::string, bool> verified_; // folder -> verified as this run's, for pruning
};

} // namespace sd
