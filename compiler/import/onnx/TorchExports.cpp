// Reading what PyTorch's ONNX exporters leave in a model (TorchExports.h).
#include "TorchExports.h"
#include "TorchFx.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include <algorithm>
#include <cctype>
#include <google/protobuf/unknown_field_set.h>
#include <set>
#include <array>
#include <cstring>
#include <optional>

using namespace mlir;

namespace sd {

// The value of metadata_props entry `key` of a proto whose metadata_props
// (field `number`) libonnx 1.12 predates, so protobuf keeps them among its
// unknown fields; "" when absent.
std::string unknownMetadata(const google::protobuf::UnknownFieldSet &unknown, int number, llvm::StringRef key) {
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField &field = unknown.field(i);
    onnx::StringStringEntryProto p;
    if (field.number() == number && field.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
        p.ParseFromString(field.length_delimited()) && p.key() == key)
      return p.value();
  }
  return "";
}

// The strings of a Python list's repr, as exporters write them in metadata:
// "['', 'model', \"it's\"]" -> "", "model", "it's".
std::vector<std::string> quotedStrings(const std::string &v) {
  std::vector<std::string> parts;
  for (size_t at = 0; (at = v.find_first_of("'\"", at)) != std::string::npos;) {
    size_t end = v.find(v[at], at + 1);
    if (end == std::string::npos) break;
    parts.push_back(v.substr(at + 1, end - at - 1));
    at = end + 1;
  }
  return parts;
}

// The PyTorch module a node came from, as the dynamo exporter records it in
// metadata_props: pkg.torch.onnx.name_scopes = "['', 'model', 'layers.0',
// 'self_attn', 'q_proj', 'linear']" (or each entry the full path so far:
// 'model.layers.0', 'model.layers.0.self_attn', ...) ->
// "model.layers.0.self_attn.q_proj" (the last entry names the op, not a module). The TorchScript exporter puts the
// same path in the node name instead (/model/layers.0/self_attn/q_proj/MatMul).
// NodeProto.metadata_props is field 9 (ONNX 1.16).
std::string torchModuleScope(const onnx::NodeProto &node) {
  constexpr int kMetadataProps = 9;
  const std::string v = unknownMetadata(node.unknown_fields(), kMetadataProps, "pkg.torch.onnx.name_scopes");
  std::vector<std::string> parts = quotedStrings(v);
  // Newer exporters write each scope's full path ('model', 'model.layers.0',
  // ...); older ones the path's next part ('model', 'layers.0', ...).
  std::string scope;
  for (size_t k = 1; k + 1 < parts.size(); ++k) {
    const std::string &part = parts[k];
    bool full = !scope.empty() && part.size() > scope.size() && part.compare(0, scope.size(), scope) == 0 &&
                part[scope.size()] == '.';
    scope = full ? part : scope + (scope.empty() ? "" : ".") + part;
  }
  return scope;
}

// The module a top-level node belongs to: the exporter's name scopes, else
// the path of a TorchScript node name ("/b.0/ln/LayerNormalization" -> "b.0.ln").
static std::string readerModule(const onnx::NodeProto &node) {
  if (std::string scope = torchModuleScope(node); !scope.empty()) return scope;
  llvm::StringRef name = node.name();
  if (!name.consume_front("/")) return "";
  size_t at = name.rfind('/');
  if (at == llvm::StringRef::npos) return "";
  std::string path = name.substr(0, at).str();
  std::replace(path.begin(), path.end(), '/', '.');
  return path;
}

// Weights that nodes of several modules read in the same role (each a
// LayerNormalization's scale, each a Gemm's bias): an exporter that merges
// equal initializers leaves this (torch.onnx.export's optimizer keeps one
// all-ones LayerNorm weight for every layer). Maps each such weight to the
// modules reading it; the driver warns when one of them trains.
DictionaryAttr sharedWeights(Builder &b, const onnx::GraphProto &g,
                             const std::unordered_set<std::string> &weights) {
  struct Readers {
    std::string role; // the first reader's "<op type>:<slot>"
    std::set<std::string> modules;
    bool mixed = false; // another role, or a reader of no known module
  };
  std::map<std::string, Readers> readers;
  for (const onnx::NodeProto &node : g.node())
    for (int i = 0; i < node.input_size(); ++i) {
      if (!weights.count(node.input(i))) continue;
      Readers &r = readers[node.input(i)];
      std::string role = node.op_type() + ":" + std::to_string(i), module = readerModule(node);
      if (r.role.empty()) r.role = role;
      r.mixed = r.mixed || r.role != role || module.empty();
      r.modules.insert(module);
    }
  SmallVector<NamedAttribute> shared;
  for (auto &[name, r] : readers) {
    if (r.mixed || r.modules.size() < 2) continue;
    std::string list;
    for (const std::string &m : r.modules) list += (list.empty() ? "" : ", ") + m;
    shared.push_back(b.getNamedAttr(name, b.getStringAttr(list)));
  }
  return b.getDictionaryAttr(shared);
}

std::map<std::string, SignatureInput> signatureInputs(const onnx::ModelProto &model) {
  std::string signature = unknownMetadata(model.graph().unknown_fields(), kGraphMetadataProps,
                                          "pkg.torch.export.ExportedProgram.graph_signature");
  std::map<std::string, SignatureInput> inputs;
  llvm::SmallVector<llvm::StringRef> lines;
  llvm::StringRef(signature).split(lines, '\n');
  for (llvm::StringRef line : lines) {
    if (line.starts_with("# outputs")) break;
    auto [placeholder, rest] = line.split(": ");
    auto [kind, fields] = rest.split(' ');
    auto [before, target] = fields.split("target='");
    if (placeholder.empty() || kind.empty() || placeholder.starts_with("#")) continue;
    inputs[placeholder.trim().str()] = {kind.trim().str(), target.split('\'').first.str()};
  }
  return inputs;
}


// Which initializers of a PyTorch export are the module's parameters. The
// dynamo exporter marks them in value_info's metadata_props (field 4, ONNX
// 1.16): kind PARAMETER, or, for an initializer its optimizer folded
// (GroupNorm's weight reshaped to [C, 1, 1]), folded_from a parameter's
// dotted module path; everything else it writes as an initializer (val_N: InstanceNorm's
// ones and zeros, rotary tables, BUFFER kinds) is a constant that full
// fine-tuning must not train. TorchScript writes constants as Constant
// nodes, or when folded as initializers named onnx::Op_N or /path, so there
// any other name is taken for a parameter.

TorchParameters torchParameters(const onnx::ModelProto &model) {
  TorchParameters tp;
  const onnx::GraphProto &g = model.graph();
  if (model.producer_name() != "pytorch") return tp;
  constexpr int kMetadataProps = 4;
  constexpr const char *kKind = "pkg.torch.export.graph_signature.InputSpec.kind";
  std::map<std::string, SignatureInput> signature = signatureInputs(model);
  std::unordered_set<std::string> parameterTargets;
  for (const auto &[placeholder, in] : signature)
    if (in.kind == "PARAMETER") parameterTargets.insert(in.target);
  // Without the signature, any dotted module path is taken for a parameter's.
  auto isParameter = [&](llvm::StringRef source) {
    return signature.empty() ? source.contains('.') : parameterTargets.count(source.str()) != 0;
  };
  for (const onnx::ValueInfoProto &vi : llvm::concat<const onnx::ValueInfoProto>(g.value_info(), g.input())) {
    std::string kind = unknownMetadata(vi.unknown_fields(), kMetadataProps, kKind);
    tp.marked |= !kind.empty();
    if (kind == "PARAMETER") tp.params.insert(vi.name());
    // "['gn.weight', 'val_15', ...]": folded from a parameter when a source
    // is one (FX's own values are named conv2d, mul_3, val_15; buffers, such
    // as GPT-J's sinusoidal table, have module paths too).
    for (const std::string &source :
         quotedStrings(unknownMetadata(vi.unknown_fields(), kMetadataProps, "pkg.onnxscript.optimizer.folded_from")))
      if (isParameter(source)) {
        tp.params.insert(vi.name());
        tp.foldedFrom.insert(source);
      }
  }
  if (tp.marked) return tp;
  tp.params.clear();
  for (const onnx::TensorProto &t : g.initializer()) {
    llvm::StringRef name = t.name();
    if (!name.empty() && !name.contains("::") && !name.starts_with("/")) tp.params.insert(t.name());
  }
  return tp;
}

FxNode parseFx(llvm::StringRef fx) {
  FxNode node;
  auto isIdentChar = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  auto [head, call] = fx.split(" = ");
  if (head.consume_front("%")) node.defines = head.take_while(isIdentChar).str();
  if (size_t at = call.find("target="); at != llvm::StringRef::npos)
    node.target = call.substr(at + 7).take_until([](char c) { return c == ']'; }).str();
  for (size_t at = call.find('%'); at != llvm::StringRef::npos; at = call.find('%', at + 1)) {
    std::string name = call.substr(at + 1).take_while(isIdentChar).str();
    if (!name.empty() && !llvm::is_contained(node.reads, name)) node.reads.push_back(name);
  }
  return node;
}

std::string fxSource(const onnx::NodeProto &n) {
  return unknownMetadata(n.unknown_fields(), kNodeMetadataProps, "pkg.torch.onnx.fx_node");
}

llvm::SmallVector<std::string> fxArguments(const onnx::NodeProto &n, llvm::StringRef target) {
  const std::string fx = fxSource(n);
  const std::string call = (target + "](args = (").str();
  size_t at = fx.find(call);
  llvm::SmallVector<std::string> args;
  if (at == std::string::npos) return args;
  llvm::SmallVector<llvm::StringRef> parts;
  llvm::StringRef(fx).substr(at + call.size()).split(')').first.split(parts, ", ");
  for (llvm::StringRef p : parts) args.push_back(p.str());
  return args;
}

std::map<std::string, std::array<std::string, 2>> trainModeBatchNorms(const onnx::ModelProto &model) {
  std::map<std::string, std::array<std::string, 2>> norms;
  std::map<std::string, SignatureInput> inputs;
  for (const onnx::NodeProto &n : model.graph().node()) {
    if (n.op_type() != "BatchNormalization" || !n.domain().empty() || n.name().empty()) continue;
    // (input, weight, bias, running_mean, running_var, training, momentum, eps)
    auto args = fxArguments(n, "aten._native_batch_norm_legit_functional.default");
    if (args.size() < 6 || args[5] != "True") continue;
    if (inputs.empty()) inputs = signatureInputs(model);
    std::array<std::string, 2> buffers;
    for (int k = 0; k < 2; ++k) {
      auto in = inputs.find(llvm::StringRef(args[size_t(3 + k)]).ltrim('%').str());
      if (in != inputs.end() && in->second.kind == "BUFFER") buffers[size_t(k)] = in->second.target;
    }
    norms[n.name()] = buffers;
  }
  return norms;
}

std::string foldedTrainModeBatchNorm(const onnx::ModelProto &model) {
  for (const onnx::NodeProto &n : model.graph().node()) {
    if (n.op_type() == "BatchNormalization" && n.domain().empty()) continue;
    auto args = fxArguments(n, "aten._native_batch_norm_legit_functional.default");
    if (args.size() < 6 || args[5] != "True") continue;
    return "node '" + n.name() + "' (" + n.op_type() + ") is PyTorch's train-mode BatchNorm folded by " +
           "torch.onnx.export's optimizer, so training cannot normalize by each batch as PyTorch does; export " +
           "with optimize=False";
  }
  return "";
}

std::vector<std::string> foldedEvalBatchNorms(const onnx::ModelProto &model) {
  std::vector<std::string> nodes;
  for (const onnx::NodeProto &n : model.graph().node())
    if ((n.op_type() != "BatchNormalization" || !n.domain().empty()) &&
        !fxArguments(n, "aten._native_batch_norm_legit_no_training.default").empty())
      nodes.push_back("'" + n.name() + "' (" + n.op_type() + ")");
  return nodes;
}

std::map<std::string, int64_t> embeddingPaddingRows(const onnx::ModelProto &model) {
  std::map<std::string, int64_t> rows;
  for (const onnx::NodeProto &n : model.graph().node()) {
    if (n.op_type() != "Gather" || !n.domain().empty() || n.name().empty() ||
        llvm::any_of(n.attribute(), [](const onnx::AttributeProto &a) { return a.name() == "axis" && a.i() != 0; }))
      continue;
    // (weight, indices, padding_idx = -1, scale_grad_by_freq, sparse)
    auto args = fxArguments(n, "aten.embedding.default");
    int64_t row = -1;
    if (args.size() >= 3 && !llvm::StringRef(args[2]).getAsInteger(10, row) && row >= 0) rows[n.name()] = row;
  }
  return rows;
}

// The running statistics of eval-mode BatchNormalizations (inputs 3 and 4)
// that are weights read in another role too: both exporters keep one
// initializer per distinct value, so a fresh BatchNorm's running mean is its
// bias (zeros) and its running variance its scale (ones). Training the
// parameter must not move the statistics, which PyTorch keeps as buffers.
std::unordered_set<std::string> mergedStatistics(const onnx::GraphProto &g,
                                                 const std::unordered_set<std::string> &weights) {
  auto isStatisticsSlot = [](const onnx::NodeProto &n, int i) {
    if (n.op_type() != "BatchNormalization" || !n.domain().empty() || (i != 3 && i != 4)) return false;
    for (const auto &a : n.attribute())
      if (a.name() == "training_mode" && a.i()) return false;
    return true;
  };
  std::unordered_set<std::string> statistics, otherUses, merged;
  for (const onnx::NodeProto &n : g.node())
    for (int i = 0; i < n.input_size(); ++i)
      if (weights.count(n.input(i))) (isStatisticsSlot(n, i) ? statistics : otherUses).insert(n.input(i));
  for (const std::string &name : statistics)
    if (otherUses.count(name)) merged.insert(name);
  return merged;
}

} // namespace sd
