// A checkpoint's manifest.json: what the checkpoint holds and how to check it.
// Written last, it commits the set of state files: one per rank (one in all
// for a run alone), each listed with its rank, size and CRC32C, and every
// tensor as the pieces the files hold (a rank's rows of a weight split by
// rows, or the whole value), each with the first row it starts at and its
// own CRC32C. The manifest ends with a CRC32C of itself.
#pragma once
#include "sd/train/checkpoint.h"
#include <map>
#include <string>
#include <vector>

namespace sd::checkpoint {

constexpr const char *kManifestFile = "manifest.json";

struct StateFile {
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Rows [firstRow, firstRow + rows) of a tensor, in `file` (a scalar is one row).
struct Piece {
  std::string file;
  int64_t firstRow = 0;
  int64_t rows = -1; // -1: all of them (version 2 manifests)
  uint32_t crc = 0;
};

struct Manifest {
  CheckpointMeta meta;
  int worldSize = 1;                            // the ranks that wrote it
  std::map<std::string, StateFile> files;       // by file name, inside the checkpoint folder
  std::map<std::string, std::vector<Piece>> tensors; // by global name
};

// The name of rank `rank`'s state file in a world of `world` ranks.
std::string stateFileName(int rank, int world);
std::string manifestText(const Manifest &m);
// Verifies the manifest's own checksum, then every field (no files are read).
// Version 2 manifests (one state file, written before sharded checkpoints) are read too.
StatusOr<Manifest> parseManifest(const std::string &text, const std::string &what);

} // namespace sd::checkpoint
