// The FX sources and graph signature the dynamo exporter writes in a
// model's metadata, as TorchExports.cpp and ExportRepairs.cpp read them.
#pragma once
#include "onnx/onnx_pb.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include <map>
#include <string>
#include <vector>

namespace sd {

// metadata_props' field numbers libonnx 1.12 predates: GraphProto's, NodeProto's.
constexpr int kGraphMetadataProps = 16, kNodeMetadataProps = 9;

// The dynamo exporter's graph signature, placeholder -> (kind, target):
// "p_fc_bias: PARAMETER target='fc.bias'", "b_bn_running_mean: BUFFER
// target='bn.running_mean' persistent=True", "x: USER_INPUT".
struct SignatureInput {
  std::string kind, target;
};
std::map<std::string, SignatureInput> signatureInputs(const onnx::ModelProto &model);

// An FX node as its source line tells it: "%layer_norm : [num_users=1] =
// call_function[target=torch.ops.aten.layer_norm.default](args = (%linear,
// [8], %p_ln_weight, None, 1e-05, False), kwargs = {})" -> defines
// "layer_norm", reads "linear" and "p_ln_weight" in that order.
struct FxNode {
  std::string defines, target;
  std::vector<std::string> reads;
};
FxNode parseFx(llvm::StringRef fx);
// A node's FX source line ("" when the exporter wrote none).
std::string fxSource(const onnx::NodeProto &n);
// The positional arguments of n's FX call when its target is `target`
// ("aten.embedding.default"): "%p_weight", "0", ... (empty otherwise).
llvm::SmallVector<std::string> fxArguments(const onnx::NodeProto &n, llvm::StringRef target);

} // namespace sd
