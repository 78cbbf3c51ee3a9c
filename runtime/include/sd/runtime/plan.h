// Plan: a verified, decoded .sdp file. Loading checks the footer, the CRC32C,
// the FlatBuffer, every index, offset and size, and re-runs each step's shape
// rule; after that nothing reads the FlatBuffer again.
#pragma once
#include "sd/format/plan_format.h"
#include "sd/ops/registry.h"
#include "sd/format/status.h"
#include <memory>
#include <string>
#include <vector>

namespace sd {

struct GlobalDesc {
  std::string name;
  DType dtype = DType::Undefined;
  Dims dims;
  GlobalRole role = GlobalRole::Frozen;
  const uint8_t *data = nullptr; // inside the mapped plan or external weights; null: starts at zero
  size_t bytes = 0;
  bool zeroInit = false; // mutable state stored nowhere: starts at zero
};

enum class BufferKind : uint8_t { Arena = 0, Global = 1, Alias = 2 };

struct BufferDesc {
  BufferKind kind = BufferKind::Arena;
  DType dtype = DType::Undefined;
  Dims dims;
  int64_t offset = 0; // arena byte offset, global index or aliased buffer index
  size_t bytes = 0;
};

struct StepDesc {
  std::string op;
  const OpSchema *schema = nullptr;
  AttrMap attrs;
  std::vector<int32_t> inputs, outputs; // -1: absent optional operand
  std::string location;
  // A Loop step: the index of its body entry; an If step: its then and else
  // entries (resolved and checked when the plan loads). Empty otherwise.
  std::vector<size_t> bodies;
};

struct EntryDesc {
  std::string name;
  std::vector<std::pair<std::string, int64_t>> bucket;
  uint64_t arenaSize = 0;
  uint64_t tensorBytes = 0; // 0 in plans older than schema 1.1
  std::vector<BufferDesc> buffers;
  std::vector<StepDesc> steps;
  std::vector<std::pair<std::string, int32_t>> inputs, outputs;
  // One per output: where its buffer is only partly filled, the one-element
  // int64 buffer counting the real slices along `axis` (buffer -1: none).
  struct Extent {
    int32_t buffer = -1;
    int32_t axis = 0;
  };
  std::vector<Extent> outputExtents;
  // The body of a Loop or If step (schema 1.5): run by that step, never on its own.
  bool isBody = false;
  // Where its buffers start in the session's arena (arenaOffset below).
  uint64_t arenaBase = 0;
};

struct PlanLoadOptions {
  bool verifyChecksum = true; // fuzzers turn this off to reach the deeper checks
};

class MappedFile;

class Plan {
public:
  static StatusOr<std::unique_ptr<Plan>> loadFile(const std::string &path,
                                                   const PlanLoadOptions &opts = {});
  // Loads from memory (copied); `what` names the source in errors.
  // (Copied into 64-byte-aligned memory.)
  static StatusOr<std::unique_ptr<Plan>> loadBytes(const uint8_t *data, size_t size,
                                                    const std::string &what,
                                                    const PlanLoadOptions &opts = {});
  ~Plan();

  std::string producer, config, externalWeights;
  uint32_t schemaMajor = 0, schemaMinor = 0;
  std::vector<uint8_t> sourceSha256;
  uint64_t weightsBytes = 0, fileBytes = 0;
  std::vector<GlobalDesc> globals;
  std::vector<EntryDesc> entries;
  std::vector<std::pair<std::string, std::string>> files; // carried files (schema 1.7): name, bytes

  // A carried file's bytes, or null.
  const std::string *file(const std::string &name) const;

  // The session's arena: one region the entries share (they run one at a
  // time), as large as the largest entry's, then one region per loop body,
  // whose steps run while the entry that loops over it holds its buffers.
  uint64_t maxArenaSize() const;
  // Index of the entry called `name` whose input shapes equal `dims`, or an error
  // that lists the buckets.
  StatusOr<size_t> selectEntry(const std::string &name, const std::vector<Dims> &inputDims) const;

private:
  Plan() = default;
  Status parse(const std::string &what, const std::string &dir, const PlanLoadOptions &opts);
  Status checkBodySteps(const std::string &what);
  Status checkNoBodyRunsItself(const std::string &what) const;
  std::unique_ptr<MappedFile> file_, external_;
  std::vector<uint8_t> owned_;
  std::vector<std::vector<uint64_t>> alignedCopies_; // misaligned external tensors
  const uint8_t *bytes_ = nullptr;
  size_t size_ = 0;
  uint64_t arenaBytes_ = 0;
};

} // namespace sd
