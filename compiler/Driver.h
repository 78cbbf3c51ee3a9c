// compileModel: ONNX file -> plan file, the whole of `sdc compile` minus flag
// parsing. Shared by sdc, the unit tests and the fuzz targets.
#pragma once
#include "Pipeline.h"
#include <string>
#include <utility>
#include <vector>

namespace sd {

struct CompileRequest {
  std::string model;  // .onnx or .onnxtxt path
  std::string output; // plan path (unused for emit != "plan")
  std::string emit = "plan"; // plan | mlir | import
  PipelineOptions pipeline;
  std::vector<std::pair<std::string, std::string>> binds; // input -> TensorProto file
  bool externalWeights = false;
  bool verbose = false;
  bool dryRun = false; // report what would train (irOut), write nothing
  int64_t maxTrip = 0;    // bound of run-time-stopped Loops (0: refuse them)
  int64_t maxUnroll = 64;
  int64_t maxSelect = 65536; // run-time Ifs: select up to this branch cost, else an If step
  std::vector<std::pair<std::string, std::string>> files; // carried in the plan (its tokenizer): name, bytes
};

// Returns true on success; `error` holds one line on failure. IR for
// emit=mlir/import goes to `irOut`; one line per warning to `warnings`
// (a compiled plan that may not train what the user expects).
bool compileModel(const CompileRequest &req, std::string &error, std::string *irOut = nullptr,
                  std::vector<std::string> *warnings = nullptr);

} // namespace sd
