// The ONNX-facing boundary of the importer: parsing (binary or text format),
// libonnx's checker and shape inference (advisory), model-local function
// inlining and external data loading. libonnx throws; this library is built
// with exceptions and nothing escapes it.
#pragma once
#include "onnx/onnx_pb.h"
#include <array>
#include <string>
#include <vector>

namespace sd {

struct LoadedModel {
  onnx::ModelProto model;
  std::string path, dir;
  std::array<uint8_t, 32> sha256{};
  std::vector<std::string> notes; // checker / shape-inference advice
};

// Returns false with `error` set (one line naming the file) on bad input.
bool loadOnnxModel(const std::string &path, LoadedModel &out, std::string &error);
// Same, from memory (fuzzing); `textFormat` selects the ONNX text parser.
bool loadOnnxModelFromBytes(const std::string &bytes, bool textFormat, const std::string &what,
                            const std::string &dir, LoadedModel &out, std::string &error);

// Reads an ONNX TensorProto file (for sdc --bind).
bool loadTensorProto(const std::string &path, onnx::TensorProto &out, std::string &error);

} // namespace sd
