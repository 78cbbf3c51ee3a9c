// Training data for plans that compute their own loss (sdc compile
// --loss-output) from inputs other than token ids, such as images and their
// classes: a folder with one NumPy array per data input of the training
// entries, NAME.npy, the examples along its first axis. Each example is one
// row of a micro-batch; the arrays are mapped, not read, so a data set larger
// than memory costs only the rows a step copies.
#pragma once
#include "sd/train/batching.h"
#include <string>
#include <vector>

namespace sd::train {

// A data input of the training entries: its name, and one micro-batch's type and shape [batch, ...].
struct TensorInput {
  std::string name;
  DType dtype = DType::Undefined;
  Dims dims;
};

struct TensorData {
  std::vector<TensorInput> inputs;
  std::vector<MappedNpy> arrays; // one per input, in the inputs' order: [examples, ...]
  std::vector<Example> examples; // Example::row = 0, 1, ...: what the data cursor walks
};

// DIR/NAME.npy for every input: its element type, and its shape past the
// first axis, must be the input's; every array holds the same number (> 0) of
// examples. Errors name the file and what is wrong.
StatusOr<TensorData> loadTensorFolder(const std::string &dir, const std::vector<TensorInput> &inputs);
// What a checkpoint records of the data: the arrays' contents (their CRC32Cs).
StatusOr<std::string> tensorFolderFingerprint(const std::string &dir, const std::vector<TensorInput> &inputs);

// The examples of `rows` (one per row) as [rows, ...] tensors named after the inputs.
struct TensorBatch {
  std::vector<HostTensor> tensors;
  TensorBatch(const Rows &rows, const TensorData &data);
  std::map<std::string, const HostTensor *> inputs() const;
};

} // namespace sd::train
