// safetensors files (weights, checkpoints, adapters): an 8-byte header length,
// a JSON header {name: {dtype, shape, data_offsets}}, then the tensor bytes.
#pragma once
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include "sd/format/tensor_io.h"
#include <map>
#include <string>
#include <vector>

namespace sd {

struct NamedTensor {
  std::string name;
  DType dtype = DType::Undefined;
  Dims dims;
  const void *data = nullptr;
  size_t bytes = 0;
};

const char *safetensorsDtypeName(DType t); // nullptr if safetensors has no name for it

// Writes atomically: a temp file in the same folder, fsync, rename over
// `path`, fsync of the folder. `metadata` (string pairs) goes in "__metadata__".
Status writeSafetensors(const std::string &path, const std::vector<NamedTensor> &tensors,
                        const std::map<std::string, std::string> &metadata = {});

struct SafetensorsFile {
  std::string bytes; // the whole file
  std::map<std::string, NamedTensor> tensors; // data points into `bytes`
  std::map<std::string, std::string> metadata;
};
// requireFinite: every float tensor is checked by checkFiniteValues (weights
// and adapters a user hands us; checkpoints have checksums instead).
StatusOr<SafetensorsFile> readSafetensors(const std::string &path, bool requireFinite = false);
// Parses a safetensors image in memory; tensors point into `data`.
Status parseSafetensors(const uint8_t *data, size_t size, const std::string &what,
                        std::map<std::string, NamedTensor> &tensors, std::map<std::string, std::string> *metadata);

// Error naming the tensor when a float tensor holds NaN or Inf: weights and
// adapters that do cannot train or generate anything meaningful.
Status checkFiniteValues(const NamedTensor &t, const std::string &what);

} // namespace sd
