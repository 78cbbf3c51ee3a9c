// torch.onnx.export's optimizer undone for training imports (ExportRepairs
// in TorchExports.h): each node's FX source against what the file holds.
#include "TorchExports.h"
#include "TorchFx.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

using namespace mlir;

namespace sd {

namespace {

// The last part of a dotted name: "layers.1.norm.weight" -> "weight".
llvm::StringRef leafName(llvm::StringRef name) {
  auto [head, tail] = name.rsplit('.');
  return tail.empty() ? head : tail;
}

// The element size of a float tensor; 0 for other types.
size_t elementSize(const onnx::TensorProto &t) {
  switch (t.data_type()) {
  case onnx::TensorProto::FLOAT: return 4;
  case onnx::TensorProto::DOUBLE: return 8;
  case onnx::TensorProto::FLOAT16: case onnx::TensorProto::BFLOAT16: return 2;
  default: return 0;
  }
}

// The raw bytes of a float tensor stored as raw_data, with its element size;
// empty when stored otherwise, or when their size is not what the dims say.
llvm::ArrayRef<char> rawBytes(const onnx::TensorProto &t, size_t &es) {
  es = elementSize(t);
  if (es == 0 || !t.has_raw_data()) return {};
  // The bytes must be exactly what the dims say (every reader indexes by
  // them; a file may lie).
  uint64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || (d != 0 && count > (uint64_t(1) << 48) / uint64_t(d))) return {};
    count *= uint64_t(d);
  }
  if (count * es != t.raw_data().size()) return {};
  return llvm::ArrayRef<char>(t.raw_data().data(), t.raw_data().size());
}

// Whether every element of a float tensor holds one value (a fill such as
// ones or zeros, what an exporter makes for a weight PyTorch passes as None).
bool uniformFill(const onnx::TensorProto &t) {
  size_t es = 0;
  llvm::ArrayRef<char> bytes = rawBytes(t, es);
  if (!bytes.empty()) {
    for (size_t at = es; at < bytes.size(); at += es)
      if (std::memcmp(bytes.data(), bytes.data() + at, es) != 0) return false;
    return true;
  }
  if (t.data_type() != onnx::TensorProto::FLOAT || t.float_data_size() == 0) return false;
  const float first = t.float_data(0);
  return std::all_of(t.float_data().begin(), t.float_data().end(),
                     [&](float v) { return std::memcmp(&v, &first, sizeof v) == 0; });
}

// Whether two rows (last-dim vectors) of a float tensor hold the same bytes
// and not one value throughout: rows a gather repeated, as no trained or
// randomly drawn parameter has them.
bool repeatsRows(const onnx::TensorProto &t) {
  size_t es = 0;
  llvm::ArrayRef<char> bytes = rawBytes(t, es);
  if (bytes.empty() || t.dims_size() < 2 || t.dims(t.dims_size() - 1) < 2 || uniformFill(t)) return false;
  const size_t row = size_t(t.dims(t.dims_size() - 1)) * es;
  std::set<llvm::StringRef> seen;
  for (size_t at = 0; at + row <= bytes.size(); at += row)
    if (!seen.insert(llvm::StringRef(bytes.data() + at, row)).second) return true;
  return false;
}

// The axes but the last along which every slice of t equals the first (t
// repeats one slice there: a broadcast the optimizer folded).
std::vector<int64_t> repeatedAxes(const onnx::TensorProto &t) {
  size_t es = 0;
  llvm::ArrayRef<char> bytes = rawBytes(t, es);
  std::vector<int64_t> axes;
  if (bytes.empty()) return axes;
  for (int a = 0; a + 1 < t.dims_size(); ++a) {
    int64_t inner = int64_t(es);
    for (int d = a + 1; d < t.dims_size(); ++d) inner *= t.dims(d);
    const int64_t n = t.dims(a), outer = int64_t(bytes.size()) / std::max<int64_t>(n * inner, 1);
    bool same = n > 1;
    for (int64_t o = 0; o < outer && same; ++o)
      for (int64_t i = 1; i < n && same; ++i)
        same = std::memcmp(bytes.data() + (o * n) * inner, bytes.data() + (o * n + i) * inner, size_t(inner)) == 0;
    if (same) axes.push_back(a);
  }
  return axes;
}

// t with the `axes` of repeated slices cut to their first: the slice once.
onnx::TensorProto firstSlices(const onnx::TensorProto &t, const std::vector<int64_t> &axes, const std::string &name) {
  size_t es = 0;
  llvm::ArrayRef<char> bytes = rawBytes(t, es);
  onnx::TensorProto out;
  out.set_name(name);
  out.set_data_type(t.data_type());
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end()), kept = dims;
  for (int64_t a : axes) kept[size_t(a)] = 1;
  for (int64_t d : kept) out.add_dims(d);
  int64_t count = 1;
  for (int64_t d : kept) count *= d;
  std::string data(size_t(count) * es, '\0');
  for (int64_t e = 0; e < count; ++e) { // element e of the result, read at the same coordinates in t
    int64_t rest = e, at = 0, stride = 1;
    for (int d = int(dims.size()) - 1; d >= 0; --d) {
      at += (rest % kept[size_t(d)]) * stride;
      rest /= kept[size_t(d)];
      stride *= dims[size_t(d)];
    }
    std::memcpy(&data[size_t(e) * es], bytes.data() + size_t(at) * es, es);
  }
  out.set_raw_data(std::move(data));
  return out;
}

// How `copy` derives from `param` when the optimizer folded it: a 2-D
// transpose, the same elements reshaped, or neither (nullopt).
std::optional<bool> foldedAsTransposeOf(const onnx::TensorProto &copy, const onnx::TensorProto &param) {
  size_t es = 0, pes = 0;
  llvm::ArrayRef<char> c = rawBytes(copy, es), p = rawBytes(param, pes);
  if (c.empty() || copy.data_type() != param.data_type() || c.size() != p.size()) return std::nullopt;
  if (copy.dims_size() == 2 && param.dims_size() == 2 && copy.dims(0) == param.dims(1) &&
      copy.dims(1) == param.dims(0)) {
    int64_t rows = param.dims(0), cols = param.dims(1);
    bool transposed = true;
    for (int64_t r = 0; r < rows && transposed; ++r)
      for (int64_t k = 0; k < cols && transposed; ++k)
        transposed = std::memcmp(p.data() + size_t(r * cols + k) * es, c.data() + size_t(k * rows + r) * es, es) == 0;
    if (transposed) return true;
  }
  if (std::memcmp(c.data(), p.data(), c.size()) == 0) return false;
  return std::nullopt;
}

} // namespace

// A TorchScript export's transposed copies of parameters the model also
// reads as themselves (a tied weight, `x @ self.a.weight.T`): its constant
// folding writes Transpose(weight) as an initializer named onnx::MatMul_N.
// The file does not say where a copy came from, so a copy is taken for a
// parameter's when it holds exactly the parameter transposed, and not one
// value throughout (a fill could be any constant).
static std::vector<ExportRepairs::Refold> transposedCopies(const onnx::GraphProto &g, const TorchParameters &tp) {
  std::vector<ExportRepairs::Refold> refolds;
  for (const onnx::TensorProto &copy : g.initializer()) {
    if (!llvm::StringRef(copy.name()).starts_with("onnx::") || copy.dims_size() != 2 || uniformFill(copy)) continue;
    for (const onnx::TensorProto &param : g.initializer())
      if (tp.params.count(param.name()) && foldedAsTransposeOf(copy, param).value_or(false)) {
        refolds.push_back({copy.name(), param.name(), true});
        break;
      }
  }
  return refolds;
}

// The module holding a module or parameter: "layers.0.ln" -> "layers.0", "ln" -> "".
static llvm::StringRef parentModule(llvm::StringRef path) {
  size_t dot = path.rfind('.');
  return dot == llvm::StringRef::npos ? llvm::StringRef() : path.take_front(dot);
}

// An FX value's op, as FX names values after it: "layer_norm_1" -> "layer_norm".
static llvm::StringRef fxOpName(llvm::StringRef value) {
  llvm::StringRef digits = value.substr(value.find_last_not_of("0123456789") + 1);
  if (!digits.empty() && value.drop_back(digits.size()).ends_with("_")) return value.drop_back(digits.size() + 1);
  return value;
}

// Nodes the optimizer's common-subexpression elimination merged: a node
// whose FX source reads a value V no node defines, where it reads the
// output of a node M of the same op (layer_norm_1 where M is layer_norm),
// computed V as M did but with parameters of equal value, merged first
// (GPT-NeoX's and Falcon's two fresh norms of one input). Those parameters
// are the unread ones of one sibling module of M's (the same parent, the
// same leaf names: post_attention_layernorm.weight and .bias beside
// input_layernorm's).
static std::vector<ExportRepairs::Unmerged> unmergedNodes(const onnx::GraphProto &g, const std::vector<FxNode> &fx,
                                                          const std::map<std::string, SignatureInput> &inputs,
                                                          const std::map<std::string, std::string> &placeholderOf,
                                                          const std::unordered_set<std::string> &defined,
                                                          const std::vector<std::string> &unread) {
  std::vector<ExportRepairs::Unmerged> out;
  // Unread parameters by module: module -> leaf -> parameter.
  std::map<std::string, std::map<std::string, std::string>> unreadModules;
  for (const std::string &param : unread) unreadModules[parentModule(param).str()][leafName(param).str()] = param;
  if (unreadModules.empty()) return out;
  std::unordered_map<std::string, int> producer;
  std::unordered_set<std::string> taken; // every value name of the graph
  for (int k = 0; k < g.node_size(); ++k)
    for (const std::string &o : g.node(k).output()) producer[o] = k, taken.insert(o);
  for (const onnx::TensorProto &t : g.initializer()) taken.insert(t.name());
  for (const onnx::ValueInfoProto &in : g.input()) taken.insert(in.name());
  std::unordered_set<std::string> claimed; // modules already given to a merged node
  for (int k = 0; k < g.node_size(); ++k) {
    const onnx::NodeProto &n = g.node(k);
    const FxNode &f = fx[size_t(k)];
    for (const std::string &value : f.reads) {
      if (inputs.count(value) || defined.count(value) || taken.count(value)) continue;
      // The slot reading a node of the same op whose FX value this node's source does not name.
      std::vector<std::pair<int, int>> slots; // (slot, producer)
      for (int j = 0; j < n.input_size(); ++j) {
        auto p = producer.find(n.input(j));
        if (p == producer.end()) continue;
        const FxNode &m = fx[size_t(p->second)];
        if (!m.defines.empty() && !llvm::is_contained(f.reads, m.defines) &&
            fxOpName(m.defines) == fxOpName(value) && g.node(p->second).output_size() == 1)
          slots.push_back({j, p->second});
      }
      if (slots.size() != 1) continue;
      auto [slot, merged] = slots.front();
      if (auto known = llvm::find_if(out, [&](auto &u) { return u.value == value; }); known != out.end()) {
        if (known->node == merged) known->readers.push_back({k, slot});
        continue;
      }
      // M's parameters: one module's, by leaf name; the slots reading them.
      std::optional<std::string> module;
      std::map<std::string, int> leafSlots;
      bool oneModule = true;
      for (const std::string &r : fx[size_t(merged)].reads) {
        auto in = inputs.find(r);
        if (in == inputs.end() || in->second.kind != "PARAMETER") continue;
        llvm::StringRef m = parentModule(in->second.target), leaf = leafName(in->second.target);
        oneModule &= !module || *module == m;
        module = m.str();
        const onnx::NodeProto &mn = g.node(merged);
        for (int i = 0; i < mn.input_size(); ++i)
          if (placeholderOf.count(mn.input(i)) && leafName(mn.input(i)) == leaf) leafSlots[leaf.str()] = i;
      }
      if (!oneModule || !module || leafSlots.empty()) continue;
      llvm::StringRef parent = parentModule(*module);
      std::vector<std::string> siblings;
      for (const auto &entry : unreadModules) {
        const std::map<std::string, std::string> &leaves = entry.second;
        if (entry.first != *module && !claimed.count(entry.first) && parentModule(entry.first) == parent &&
            leaves.size() == leafSlots.size() &&
            llvm::all_of(leafSlots, [&](auto &ls) { return leaves.count(ls.first) != 0; }))
          siblings.push_back(entry.first);
      }
      if (siblings.size() != 1) continue;
      claimed.insert(siblings[0]);
      ExportRepairs::Unmerged u{merged, value, {}, {{k, slot}}};
      for (const auto &[leaf, i] : leafSlots) u.params.push_back({i, unreadModules[siblings[0]][leaf]});
      out.push_back(std::move(u));
    }
  }
  return out;
}

ExportRepairs exportRepairs(const onnx::ModelProto &model, const TorchParameters &tp) {
  ExportRepairs out;
  if (!tp.marked) {
    out.refolds = transposedCopies(model.graph(), tp);
    return out;
  }
  std::map<std::string, SignatureInput> inputs = signatureInputs(model);
  if (inputs.empty()) return out;
  const onnx::GraphProto &g = model.graph();
  std::unordered_map<std::string, const onnx::TensorProto *> inits;
  for (const onnx::TensorProto &t : g.initializer()) inits[t.name()] = &t;
  std::map<std::string, std::string> placeholderOf; // parameter -> its FX placeholder
  for (const auto &[placeholder, in] : inputs)
    if (in.kind == "PARAMETER" && !in.target.empty()) placeholderOf[in.target] = placeholder;
  auto inFile = [&](const SignatureInput &in) {
    return in.target.empty() || inits.count(in.target) || tp.foldedFrom.count(in.target);
  };

  std::vector<FxNode> fx(size_t(g.node_size()));
  std::unordered_set<std::string> defined; // FX values some node of the file computes
  for (int k = 0; k < g.node_size(); ++k)
    if (std::string source = fxSource(g.node(k)); !source.empty()) {
      fx[size_t(k)] = parseFx(source);
      defined.insert(fx[size_t(k)].defines);
    }
  // Whether `copy` is read, and only by nodes whose FX source `reads` names
  // `param`'s placeholder.
  auto readOnlyAs = [&](const std::string &copy, const std::string &param, auto reads) {
    bool read = false;
    for (int k = 0; k < g.node_size(); ++k) {
      const onnx::NodeProto &n = g.node(k);
      if (!llvm::is_contained(n.input(), copy)) continue;
      if (!n.domain().empty() || !reads(n, fx[size_t(k)], placeholderOf[param])) return false;
      read = true;
    }
    return read;
  };
  // A MatMul reading the copy as the weight of the aten.linear that read
  // the parameter: the copy is the parameter transposed.
  auto linearWeight = [&](const std::string &copy) {
    return [&copy](const onnx::NodeProto &n, const FxNode &f, const std::string &placeholder) {
      return n.op_type() == "MatMul" && n.input(0) != copy && llvm::StringRef(f.target).starts_with("torch.ops.aten.linear.") &&
             f.reads.size() >= 2 && f.reads[1] == placeholder;
    };
  };
  // A copy named after the FX value it folded, and that value a 2-D
  // transpose (FX names a value after its op: `x @ self.weight.T` in
  // Falcon's linear layers is aten.permute, "permute_3"), read by MatMuls
  // as their right operand: the copy is the parameter transposed.
  auto transposeValue = [&](const std::string &copy) {
    llvm::StringRef op = llvm::StringRef(copy).rtrim("0123456789");
    op.consume_back("_");
    if (op != "permute" && op != "t" && op != "transpose" && op != "numpy_T") return false;
    bool read = false;
    for (const onnx::NodeProto &n : g.node())
      if (llvm::is_contained(n.input(), copy)) {
        if (n.op_type() != "MatMul" || !n.domain().empty() || n.input(0) == copy) return false;
        read = true;
      }
    return read;
  };
  // A PyTorch op whose every parameter is a vector (a norm's affine, PReLU's
  // slopes): the copy is the parameter reshaped to broadcast.
  auto vectorParameter = [](const onnx::NodeProto &, const FxNode &f, const std::string &placeholder) {
    llvm::StringRef t = f.target;
    return llvm::is_contained(f.reads, placeholder) &&
           (t.starts_with("torch.ops.aten.group_norm.") || t.starts_with("torch.ops.aten.native_group_norm.") ||
            t.starts_with("torch.ops.aten.prelu.") || t.starts_with("torch.ops.aten._prelu_kernel.") ||
            t.starts_with("torch.ops.aten.instance_norm.") || t.starts_with("torch.ops.aten.batch_norm."));
  };

  // Copies folded from parameters.
  std::map<std::string, std::vector<std::string>> copiesOf; // parameter -> the initializers folded from it
  std::map<std::string, std::vector<std::string>> sourcesOf;
  for (const onnx::ValueInfoProto &vi : g.value_info()) {
    constexpr int kMetadataProps = 4;
    for (const std::string &source :
         quotedStrings(unknownMetadata(vi.unknown_fields(), kMetadataProps, "pkg.onnxscript.optimizer.folded_from")))
      if (placeholderOf.count(source) && inits.count(vi.name()) &&
          elementSize(*inits[vi.name()]) != 0) {
        sourcesOf[vi.name()].push_back(source);
        copiesOf[source].push_back(vi.name());
      }
  }
  for (const auto &[copy, sources] : sourcesOf) {
    const std::string &param = sources.front();
    std::string list;
    for (const std::string &s : sources) list += (list.empty() ? "'" : ", '") + s + "'";
    bool alone = sources.size() == 1 && !inits.count(param) && copiesOf[param].size() == 1;
    if (alone) {
      // The parameter trains as this copy, one to one with it, unless the
      // optimizer gathered its rows with repeats (BERT's token type
      // embedding picked for every position): then each repeat trains apart.
      // Where the repeats are whole slices along some axes (one batch item's
      // or position's rows for every one), those rows train once, under the
      // copy's name + ".rows": the parameter's other rows are not in the file.
      if (repeatsRows(*inits[copy])) {
        std::vector<int64_t> axes = repeatedAxes(*inits[copy]);
        if (!axes.empty() && !repeatsRows(firstSlices(*inits[copy], axes, copy))) {
          out.refolds.push_back({copy, copy + ".rows", false, true, axes});
          out.foldedTogether[copy + ".rows"] =
              "holds the rows torch.onnx.export's optimizer gathered from the parameter " + list +
              " for every batch item or position: they train as PyTorch's do, but are saved under this name";
        } else
          out.foldedTogether[copy] = "is what torch.onnx.export's optimizer gathered from the parameter " + list +
                                     " with rows repeated: each repeat trains apart, where PyTorch sums their gradients";
      }
      // Else, where the PyTorch op tells how, the parameter is restored
      // from the copy under its own name: a Linear's weight that a MatMul
      // reads (its input has more than two dims) transposed, a norm's or
      // PReLU's vector reshaped.
      else if (const onnx::TensorProto &t = *inits[copy];
               t.dims_size() == 2 && (readOnlyAs(copy, param, linearWeight(copy)) || transposeValue(copy)))
        out.refolds.push_back({copy, param, /*transposed=*/true, /*restored=*/true});
      else if (llvm::count_if(t.dims(), [](int64_t d) { return d != 1; }) <= 1 && readOnlyAs(copy, param, vectorParameter))
        out.refolds.push_back({copy, param, /*transposed=*/false, /*restored=*/true});
      // Else the copy is some other function of the parameter alone (GPT-2's
      // position rows gathered by a constant arange, Gemma's 1 + weight):
      // it trains in the parameter's stead (the same gradient where the
      // function is a gather or a shift), but the parameter cannot be made
      // from it.
      // A copy of one value throughout (a fresh token of zeros expanded per
      // batch item) may hold repeats, which nothing tells apart.
      else if (uniformFill(t))
        out.foldedTogether[copy] = "is what torch.onnx.export's optimizer computed from the parameter " + list +
                                   ", one value throughout (fresh), so sdc cannot tell which elements repeat one of "
                                   "the parameter's: each trains apart, where PyTorch sums the gradients of repeats";
      else
        out.foldedTogether[copy] = "is what torch.onnx.export's optimizer computed from the parameter " + list +
                                   " alone (rows it gathered, a slice, a shift such as Gemma's 1 + weight): it trains "
                                   "in the parameter's stead, and is saved as computed, under this name";
      continue;
    }
    std::optional<bool> transposed;
    if (sources.size() == 1 && inits.count(param)) transposed = foldedAsTransposeOf(*inits[copy], *inits[param]);
    if (transposed) {
      out.refolds.push_back({copy, param, *transposed});
      continue;
    }
    out.foldedTogether[copy] =
        sources.size() > 1
            ? "is what torch.onnx.export's optimizer computed from the parameters " + list +
                  " and trains as one tensor, where PyTorch trains them"
            : "is what torch.onnx.export's optimizer copied from the parameter " + list +
                  ", which the model reads elsewhere too: the two train apart, unlike in PyTorch";
  }

  // Nodes reading what their FX source does not name.
  for (int k = 0; k < g.node_size(); ++k) {
    const FxNode &f = fx[size_t(k)];
    const onnx::NodeProto &n = g.node(k);
    if (f.defines.empty() || !n.domain().empty()) continue;
    // A bias the optimizer removed: (input, weight, bias, ...) of a linear
    // layer or convolution, or (bias, input, weight) of addmm (GPT-2's
    // Conv1D), the bias a parameter the file lacks.
    llvm::StringRef target = f.target;
    int biasRead = target.starts_with("torch.ops.aten.linear.") || target.starts_with("torch.ops.aten.conv") ? 2
                   : target.starts_with("torch.ops.aten.addmm.")                                             ? 0
                                                                                                             : -1;
    if (biasRead >= 0 && n.input_size() == 2 && f.reads.size() >= 3 &&
        (n.op_type() == "Gemm" || n.op_type() == "Conv" || n.op_type() == "ConvTranspose"))
      if (auto in = inputs.find(f.reads[size_t(biasRead)]);
          in != inputs.end() && in->second.kind == "PARAMETER" && !inFile(in->second))
        out.restoredBiases.push_back({k, in->second.target});

    // A BatchNormalization's running statistics (slots 3 and 4) are
    // buffers, which the import gives weights of their own where they were
    // merged (mergedStatistics, trainModeStatistics): only its scale and
    // bias are rereads here, and a missing buffer is accounted for.
    const bool batchNorm = n.op_type() == "BatchNormalization";
    std::vector<int> unnamed; // slots reading a parameter the FX source does not name
    for (int i = 0; i < (batchNorm ? std::min(3, n.input_size()) : n.input_size()); ++i)
      if (auto ph = placeholderOf.find(n.input(i)); ph != placeholderOf.end() && inits.count(n.input(i)) &&
                                                    !llvm::is_contained(f.reads, ph->second))
        unnamed.push_back(i);
    if (unnamed.empty()) continue;
    std::vector<std::string> missingParams;
    bool missingConstant = false;
    int undefinedReads = 0; // FX values no node computes: removed aliases, or values folded into initializers
    for (const std::string &r : f.reads) {
      auto in = inputs.find(r);
      if (in == inputs.end()) undefinedReads += !defined.count(r);
      else if (!inFile(in->second) && in->second.kind == "PARAMETER") missingParams.push_back(in->second.target);
      else if (!inFile(in->second)) missingConstant |= !(batchNorm && in->second.kind == "BUFFER");
    }
    // Each undefined value must be some computed input of the node (an
    // aten.alias the optimizer removed, the MatMul half of a decomposed
    // linear), else a parameter slot may stand for a folded value rather
    // than a parameter (Gemma's 1 + weight).
    int computedInputs = 0;
    for (const std::string &in : n.input())
      computedInputs += !in.empty() && !inits.count(in) && !llvm::is_contained(f.reads, in);
    if (undefinedReads > computedInputs) continue;
    if (missingParams.empty()) {
      // Every value the PyTorch op read is accounted for, so the parameter
      // stands in for a constant of the exporter's (a fill of equal value).
      for (int i : unnamed)
        if (uniformFill(*inits[n.input(i)])) out.rereads.push_back({k, i, n.input(i), ""});
      continue;
    }
    if (missingConstant) continue;
    // Another module's parameter of equal value: each slot gets the missing
    // parameter of its leaf name (ln_1.weight read where ln_2.weight was),
    // and a last slot left the last parameter left.
    std::vector<std::string> chosen(unnamed.size());
    for (size_t j = 0; j < unnamed.size(); ++j) {
      std::vector<std::string> same;
      for (const std::string &m : missingParams)
        if (leafName(m) == leafName(n.input(unnamed[j]))) same.push_back(m);
      if (same.size() == 1 && !llvm::is_contained(chosen, same[0])) chosen[j] = same[0];
    }
    std::vector<std::string> leftParams;
    for (const std::string &m : missingParams)
      if (!llvm::is_contained(chosen, m)) leftParams.push_back(m);
    if (llvm::count(chosen, "") == 1 && leftParams.size() == 1) *llvm::find(chosen, "") = leftParams[0];
    if (llvm::is_contained(chosen, "")) continue;
    for (size_t j = 0; j < chosen.size(); ++j)
      out.rereads.push_back({k, unnamed[j], n.input(unnamed[j]), chosen[j]});
  }

  // Tied parameters: an embedding's or linear layer's op that reads another
  // module's parameter where its own would be, its own listed in the
  // signature but read by no node and not in the file (the LM head's
  // aten.linear reading the embedding's weight, or the embedding's
  // aten.embedding the head's; nn.Embedding's subclasses, such as BART's
  // and Gemma's scaled embeddings, too). That own name tells the module's
  // op from a parent's functional call on a child's weight.
  std::unordered_set<std::string> read;
  for (const FxNode &f : fx) read.insert(f.reads.begin(), f.reads.end());
  for (int k = 0; k < g.node_size(); ++k) {
    const FxNode &f = fx[size_t(k)];
    llvm::StringRef target = f.target;
    // (placeholder, the leaf name the module gives it)
    std::vector<std::pair<std::string, const char *>> roles;
    if (target.starts_with("torch.ops.aten.embedding.") && !f.reads.empty()) roles.push_back({f.reads[0], "weight"});
    if (target.starts_with("torch.ops.aten.linear.") && f.reads.size() >= 2) {
      roles.push_back({f.reads[1], "weight"});
      if (f.reads.size() >= 3) roles.push_back({f.reads[2], "bias"});
    }
    // The module's own name for the parameter, and its parent's: Hugging
    // Face's MLM heads tie their decoder's bias to their own
    // (`self.decoder.bias = self.bias`, BERT's cls.predictions.bias).
    const std::string scopeName = torchModuleScope(g.node(k));
    llvm::StringRef scope = scopeName;
    if (scope.empty()) continue;
    for (const auto &[placeholder, leaf] : roles) {
      auto in = inputs.find(placeholder);
      if (in == inputs.end() || in->second.kind != "PARAMETER") continue;
      for (llvm::StringRef module : {scope, parentModule(scope)}) {
        std::string own = (module + "." + leaf).str();
        auto ownIn = placeholderOf.find(own);
        if (module.empty() || in->second.target == own || ownIn == placeholderOf.end() || read.count(ownIn->second) ||
            inFile(inputs[ownIn->second]))
          continue;
        std::vector<std::string> &names = out.tiedNames[in->second.target];
        if (!llvm::is_contained(names, own)) names.push_back(own);
      }
    }
  }

  // Parameters the file lacks that no repair restored: dropped where the
  // forward reads them (some node's FX source names their placeholder),
  // else unread, unless a merged node reads them again (unmergedNodes).
  std::unordered_set<std::string> restored;
  for (const ExportRepairs::Reread &r : out.rereads)
    if (!r.weight.empty()) restored.insert(r.weight);
  for (const ExportRepairs::RestoredBias &b : out.restoredBiases) restored.insert(b.parameter);
  for (const ExportRepairs::Refold &r : out.refolds) restored.insert(r.parameter);
  for (const auto &[names, tied] : out.tiedNames) restored.insert(tied.begin(), tied.end());
  std::vector<std::string> unread;
  for (const auto &[placeholder, in] : inputs)
    if (in.kind == "PARAMETER" && !inFile(in) && !restored.count(in.target))
      (read.count(placeholder) ? out.dropped : unread).push_back(in.target);
  out.unmerged = unmergedNodes(g, fx, inputs, placeholderOf, defined, unread);
  for (const ExportRepairs::Unmerged &u : out.unmerged)
    for (const auto &[slot, param] : u.params) restored.insert(param);
  for (const std::string &param : unread)
    if (!restored.count(param)) out.unread.push_back(param);
  return out;
}

// The nodes that compute a refolded copy from its parameter: a Transpose,
// or a Constant shape and a Reshape (an Expand for repeated slices).
static std::vector<onnx::NodeProto> refoldNodes(const ExportRepairs::Refold &r, const onnx::TensorProto &copy) {
  std::vector<onnx::NodeProto> nodes(r.transposed ? 1 : 2);
  onnx::NodeProto &last = nodes.back();
  const bool broadcast = !r.broadcastAxes.empty();
  last.set_name(r.copy);
  last.add_input(r.parameter);
  last.add_output(r.copy);
  if (r.transposed) {
    last.set_op_type("Transpose");
    onnx::AttributeProto *perm = last.add_attribute();
    perm->set_name("perm");
    perm->set_type(onnx::AttributeProto::INTS);
    perm->add_ints(1);
    perm->add_ints(0);
    return nodes;
  }
  last.set_op_type(broadcast ? "Expand" : "Reshape");
  last.add_input(r.copy + ".shape");
  onnx::NodeProto &shape = nodes.front();
  shape.set_name(r.copy + ".shape");
  shape.set_op_type("Constant");
  shape.add_output(r.copy + ".shape");
  onnx::AttributeProto *value = shape.add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  value->mutable_t()->set_data_type(onnx::TensorProto::INT64);
  value->mutable_t()->add_dims(copy.dims_size());
  for (int64_t d : copy.dims()) value->mutable_t()->add_int64_data(d);
  return nodes;
}

onnx::TensorProto restoredParameter(const ExportRepairs::Refold &r, const onnx::TensorProto &copy) {
  if (!r.broadcastAxes.empty()) return firstSlices(copy, r.broadcastAxes, r.parameter);
  onnx::TensorProto param;
  param.set_name(r.parameter);
  param.set_data_type(copy.data_type());
  size_t es = 0;
  llvm::ArrayRef<char> c = rawBytes(copy, es);
  if (c.empty() || (r.transposed && copy.dims_size() != 2)) return param; // no data: the importer refuses it
  if (!r.transposed) { // a vector
    param.add_dims(int64_t(c.size() / es));
    param.set_raw_data(c.data(), c.size());
    return param;
  }
  const int64_t rows = copy.dims(0), cols = copy.dims(1);
  param.add_dims(cols);
  param.add_dims(rows);
  std::string bytes(c.size(), '\0');
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < cols; ++k)
      std::memcpy(&bytes[size_t(k * rows + i) * es], c.data() + size_t(i * cols + k) * es, es);
  param.set_raw_data(std::move(bytes));
  return param;
}

std::optional<onnx::TensorProto> zeroBias(const onnx::NodeProto &n, const onnx::TensorProto &w,
                                          const std::string &name) {
  auto intAttr = [&](const char *attr, int64_t otherwise) {
    for (const auto &a : n.attribute())
      if (a.name() == attr) return a.i();
    return otherwise;
  };
  size_t es = elementSize(w);
  if (w.dims_size() < 2 || es == 0) return std::nullopt;
  int64_t length = n.op_type() == "Gemm"            ? w.dims(intAttr("transB", 0) ? 0 : 1)
                   : n.op_type() == "ConvTranspose" ? w.dims(1) * intAttr("group", 1)
                                                    : w.dims(0);
  if (length <= 0) return std::nullopt;
  onnx::TensorProto zeros;
  zeros.set_name(name);
  zeros.set_data_type(w.data_type());
  zeros.add_dims(length);
  zeros.set_raw_data(std::string(size_t(length) * es, '\0'));
  return zeros;
}

google::protobuf::RepeatedPtrField<onnx::NodeProto> repairedNodes(const onnx::GraphProto &g,
                                                                   const ExportRepairs &r) {
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (const ExportRepairs::Refold &f : r.refolds)
    for (const onnx::TensorProto &t : g.initializer())
      if (t.name() == f.copy) {
        for (onnx::NodeProto &n : refoldNodes(f, t)) *nodes.Add() = std::move(n);
        break;
      }
  const int first = nodes.size();
  for (const onnx::NodeProto &n : g.node()) *nodes.Add() = n;
  for (const ExportRepairs::Reread &rr : r.rereads) nodes.Mutable(first + rr.node)->set_input(rr.slot, rereadName(rr));
  for (const ExportRepairs::RestoredBias &b : r.restoredBiases) nodes.Mutable(first + b.node)->add_input(b.parameter);
  if (r.unmerged.empty()) return nodes;
  // Each merged value computed again by a copy of its node, right after it.
  for (const ExportRepairs::Unmerged &u : r.unmerged)
    for (auto [node, slot] : u.readers) nodes.Mutable(first + node)->set_input(slot, u.value);
  google::protobuf::RepeatedPtrField<onnx::NodeProto> withCopies;
  for (int i = 0; i < nodes.size(); ++i) {
    *withCopies.Add() = nodes.Get(i);
    for (const ExportRepairs::Unmerged &u : r.unmerged) {
      if (i != first + u.node) continue;
      onnx::NodeProto copy = nodes.Get(i);
      copy.set_name(copy.name() + "/" + u.value);
      copy.set_output(0, u.value);
      for (const auto &[slot, param] : u.params) copy.set_input(slot, param);
      *withCopies.Add() = std::move(copy);
    }
  }
  return withCopies;
}

void repairModel(onnx::ModelProto &model, const ExportRepairs &r) {
  onnx::GraphProto &g = *model.mutable_graph();
  auto find = [&](const std::string &name) -> onnx::TensorProto * {
    for (onnx::TensorProto &t : *g.mutable_initializer())
      if (t.name() == name) return &t;
    return nullptr;
  };
  ExportRepairs applied; // what this model can take: a source to copy, a weight to size the bias by
  for (const ExportRepairs::Refold &f : r.refolds) {
    const onnx::TensorProto *copy = find(f.copy);
    if (!copy) continue;
    if (f.restored && !find(f.parameter)) *g.add_initializer() = restoredParameter(f, *copy);
    applied.refolds.push_back(f);
  }
  for (const ExportRepairs::Reread &rr : r.rereads) {
    const onnx::TensorProto *source = find(rr.source);
    if (!source) continue;
    if (!find(rereadName(rr))) {
      onnx::TensorProto copy = *source;
      copy.set_name(rereadName(rr));
      *g.add_initializer() = std::move(copy);
    }
    applied.rereads.push_back(rr);
  }
  for (const ExportRepairs::Unmerged &u : r.unmerged) {
    bool made = true;
    for (const auto &[slot, param] : u.params) {
      const onnx::TensorProto *source = find(g.node(u.node).input(slot));
      if (!source) made = false;
      else if (!find(param)) {
        onnx::TensorProto copy = *source;
        copy.set_name(param);
        *g.add_initializer() = std::move(copy);
      }
    }
    if (made) applied.unmerged.push_back(u);
  }
  for (const ExportRepairs::RestoredBias &b : r.restoredBiases) {
    const onnx::NodeProto &n = g.node(b.node);
    const onnx::TensorProto *w = find(n.input(1));
    std::optional<onnx::TensorProto> zeros = w ? zeroBias(n, *w, b.parameter) : std::nullopt;
    if (!zeros || find(b.parameter)) continue;
    *g.add_initializer() = std::move(*zeros);
    applied.restoredBiases.push_back(b);
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes = repairedNodes(g, applied);
  g.mutable_node()->Swap(&nodes);
  for (const ExportRepairs::Refold &f : applied.refolds)
    for (int i = 0; i < g.initializer_size(); ++i)
      if (g.initializer(i).name() == f.copy) {
        g.mutable_initializer()->DeleteSubrange(i, 1);
        break;
      }
}

} // namespace sd
