// sdc merge: folds trained weights back into the source ONNX model, so any
// ONNX runtime runs the result: a LoRA adapter (W += scale * B A, untying a
// shared weight first so only the adapted use changes) or the parameters a
// full fine-tuning run saved (--save-weights).
#pragma once
#include <string>

namespace sd {

struct MergeRequest {
  std::string model, output;
  std::string adapterDir;  // HF PEFT layout
  std::string weightsFile; // safetensors keyed by initializer name
  int64_t adapterRank = 0; // > 0: a LoRA's first ranks only (a DyLoRA adapter at that rank)
};

bool mergeModel(const MergeRequest &req, std::string &error);

} // namespace sd
