// sdc merge (see Merge.h).
#include "Merge.h"
#include "OnnxFrontend.h"
#include "OnnxImporter.h"
#include "OsftSplit.h"
#include "PassDetail.h"
#include "Passes.h"
#include "GlobalData.h"
#include "LoraBaseStart.h"
#include "TorchExports.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "sd/format/peft.h"
#include "sd/format/safetensors.h"
#include <cmath>
#include <cstring>
#include <map>
#include <set>

namespace sd {
namespace {

using llvm::StringRef;

onnx::TensorProto *findInitializer(onnx::ModelProto &m, const std::string &name) {
  for (auto &t : *m.mutable_graph()->mutable_initializer())
    if (t.name() == name) return &t;
  return nullptr;
}

bool floatsOf(const onnx::TensorProto &t, std::vector<float> &out) {
  if (t.data_type() != onnx::TensorProto::FLOAT) return false;
  int64_t n = 1;
  for (int64_t d : t.dims()) n *= d;
  if (t.has_raw_data()) {
    if (t.raw_data().size() != size_t(n) * 4) return false;
    out.resize(size_t(n));
    std::memcpy(out.data(), t.raw_data().data(), t.raw_data().size());
  } else {
    if (t.float_data_size() != n) return false;
    out.assign(t.float_data().begin(), t.float_data().end());
  }
  return true;
}

void setFloats(onnx::TensorProto &t, const std::vector<float> &v) {
  t.clear_float_data();
  t.set_raw_data(std::string(reinterpret_cast<const char *>(v.data()), v.size() * 4));
}

struct LinearUse {
  std::string weight, layout, node;
  int64_t input = 1;
  bool shared = false; // the weight has other uses (a tied embedding)
  std::string bias;    // its bias initializer ("" when none)
  bool biasShared = false;
};

onnx::TensorProto *untiedInitializer(onnx::ModelProto &m, const std::string &name);

// The initializer of the model's parameter `name`, untied from an Identity
// where the export shared it (untiedInitializer); null when there is none.
onnx::TensorProto *parameterInitializer(onnx::ModelProto &m, const std::string &name) {
  onnx::TensorProto *w = findInitializer(m, name);
  return w ? w : untiedInitializer(m, name);
}

// Writes the f32 values of `t` into `w`; false, writing nothing, when either
// is not f32 or their shapes differ.
bool replaceValues(onnx::TensorProto &w, const NamedTensor &t) {
  if (w.data_type() != onnx::TensorProto::FLOAT || t.dtype != DType::F32 || t.dims != Dims(w.dims().begin(), w.dims().end()))
    return false;
  std::vector<float> v(t.bytes / 4);
  std::memcpy(v.data(), t.data, t.bytes);
  setFloats(w, v);
  return true;
}

// Runs the importer and sd-form-linear to learn each module's weight and its use.
bool linearModules(const LoadedModel &lm, const std::string &path, std::map<std::string, LinearUse> &out,
                   std::string &error) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<ir::SDDialect, mlir::func::FuncDialect>();
  std::string first;
  mlir::ScopedDiagnosticHandler handler(&ctx, [&](mlir::Diagnostic &d) {
    if (first.empty()) first = d.str();
    return mlir::success();
  });
  ImportOptions io;
  io.modelPath = path;
  auto module = importOnnxModel(&ctx, lm.model, io, error);
  if (!module) return false;
  mlir::PassManager pm(&ctx);
  pm.addPass(createFormLinear());
  if (mlir::failed(pm.run(*module))) return error = path + ": " + first, false;
  std::map<std::string, int> uses;
  module->walk([&](ir::GlobalLoadOp load) {
    for (mlir::Operation *u : load->getUsers()) (void)u, ++uses[load.getGlobal().str()];
  });
  module->walk([&](ir::LinearOp l) {
    auto load = l.getWeight().getDefiningOp<ir::GlobalLoadOp>();
    if (!load) return;
    LinearUse u;
    u.weight = load.getGlobal().str();
    u.layout = l.getLayout().str();
    if (auto n = l->getAttrOfType<mlir::StringAttr>("sd.weight_node")) u.node = n.str();
    if (auto i = l->getAttrOfType<mlir::IntegerAttr>("sd.weight_input")) u.input = i.getInt();
    if (auto bias = l.getBias().getDefiningOp<ir::GlobalLoadOp>()) u.bias = bias.getGlobal().str();
    out[l.getModule().str()] = u;
  });
  for (auto &[m, u] : out) {
    u.shared = uses[u.weight] > 1;
    u.biasShared = !u.bias.empty() && uses[u.bias] > 1;
  }
  return true;
}

onnx::NodeProto *findNode(onnx::ModelProto &m, const std::string &name) {
  for (auto &n : *m.mutable_graph()->mutable_node())
    if (n.name() == name || (n.name().empty() && n.output_size() && n.output(0) == name + "_output_0")) return &n;
  return nullptr;
}

// A linear module's 2-D f32 weight: its use, its initializer and values, and
// W's [out, in] (layout "oi" stores it so; "io" transposed).
struct ModuleWeight {
  const LinearUse *use = nullptr;
  onnx::TensorProto *tensor = nullptr;
  std::vector<float> values;
  int64_t out = 0, in = 0;
  bool oi = false;
  // W[o, i] wherever the layout stores it.
  float &at(int64_t o, int64_t i) { return values[size_t(oi ? o * in + i : i * out + o)]; }
};

// An adapter file's tensors by module: each key is "base_model.model." +
// module + one of `suffixes` (keys in `elsewhere` are the caller's to read);
// a module's parts[k] is its tensor of suffixes[k], or null. Any other key is
// an error naming `what` ("a LoRA weight").
using ModuleTensors = std::map<std::string, std::vector<const NamedTensor *>>;
bool tensorsByModule(const SafetensorsFile &file, const std::vector<const char *> &suffixes, const std::string &what,
                     const MergeRequest &req, ModuleTensors &out, std::string &error,
                     const std::set<std::string> &elsewhere = {}) {
  const std::string prefix = adapterKey("");
  for (auto &[key, t] : file.tensors) {
    if (elsewhere.count(key)) continue;
    size_t part = suffixes.size();
    for (size_t k = 0; k < suffixes.size(); ++k)
      if (StringRef(key).ends_with(suffixes[k])) part = k;
    if (!StringRef(key).starts_with(prefix) || part == suffixes.size())
      return error = req.adapterDir + ": tensor '" + key + "' is not " + what + " in PEFT's layout", false;
    auto &parts = out[key.substr(prefix.size(), key.size() - prefix.size() - std::strlen(suffixes[part]))];
    parts.resize(suffixes.size());
    parts[part] = &t;
  }
  return true;
}

bool moduleWeight(LoadedModel &lm, const MergeRequest &req, const std::map<std::string, LinearUse> &linears,
                  const std::string &m, ModuleWeight &mw, std::string &error) {
  auto it = linears.find(m);
  if (it == linears.end()) return error = req.adapterDir + ": module '" + m + "' is not a linear layer of " + req.model, false;
  mw.use = &it->second;
  mw.tensor = findInitializer(lm.model, mw.use->weight);
  if (!mw.tensor || !floatsOf(*mw.tensor, mw.values) || mw.tensor->dims_size() != 2)
    return error = req.model + ": weight '" + mw.use->weight + "' of module '" + m + "' is not a 2-D f32 initializer",
           false;
  mw.oi = mw.use->layout == "oi";
  mw.out = mw.tensor->dims(mw.oi ? 0 : 1);
  mw.in = mw.tensor->dims(mw.oi ? 1 : 0);
  return true;
}

// Writes a module's merged weight: in place, or, for a tied weight (embedding
// and head), as this use's own copy.
bool storeMerged(LoadedModel &lm, const MergeRequest &req, const std::string &m, const LinearUse &u,
                 onnx::TensorProto &w, const std::vector<float> &wv, std::string &error) {
  if (!u.shared) {
    setFloats(w, wv);
    return true;
  }
  onnx::NodeProto *node = findNode(lm.model, u.node);
  if (!node || u.input >= node->input_size() || node->input(int(u.input)) != u.weight)
    return error = req.model + ": cannot find the node that reads '" + u.weight + "' for module '" + m + "'", false;
  std::string name = m + ".weight";
  while (findInitializer(lm.model, name)) name += "_merged";
  onnx::TensorProto *copy = lm.model.mutable_graph()->add_initializer();
  *copy = w;
  copy->set_name(name);
  setFloats(*copy, wv);
  node->set_input(int(u.input), name);
  return true;
}

// An OSF adapter: each module's W becomes W - (its low part) + the adapter's
// U_low diag(S_low) V_low, the low part from the same SVD split sdc compile
// makes (the high part stays W's own, as PEFT's merge keeps it).
bool mergeOsfAdapter(LoadedModel &lm, const MergeRequest &req, const SafetensorsFile &file,
                     std::map<std::string, LinearUse> &linears, std::string &error) {
  ModuleTensors modules;
  if (!tensorsByModule(file, {kOsfSuffixes[0], kOsfSuffixes[1], kOsfSuffixes[2]}, "an OSF factor", req, modules, error))
    return false;
  for (auto &[m, parts] : modules) {
    ModuleWeight mw;
    if (!moduleWeight(lm, req, linears, m, mw, error)) return false;
    if (!parts[0] || !parts[1] || !parts[2])
      return error = req.adapterDir + ": module '" + m + "' lacks one of U_low, S_low, V_low", false;
    int64_t out = mw.out, inF = mw.in, minDim = std::min(out, inF);
    const NamedTensor &U = *parts[0], &S = *parts[1], &V = *parts[2];
    int64_t r = S.dims.size() == 1 ? S.dims[0] : -1;
    if (U.dtype != DType::F32 || S.dtype != DType::F32 || V.dtype != DType::F32 || r < 1 || r >= minDim ||
        U.dims != Dims{out, r} || V.dims != Dims{r, inF})
      return error = req.adapterDir + ": module '" + m + "' needs f32 U_low [" + std::to_string(out) + "x r], S_low [r], V_low [r x " +
                     std::to_string(inF) + "] with 1 <= r < " + std::to_string(minDim) + ", got " + formatDims(U.dims) +
                     ", " + formatDims(S.dims) + ", " + formatDims(V.dims),
             false;
    std::vector<double> wd(size_t(out * inF));
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < inF; ++i) wd[size_t(o * inF + i)] = mw.at(o, i);
    SvdFactors f;
    std::string why;
    if (!svdSplit(wd, out, inF, f, why)) return error = req.model + ": module '" + m + "': " + why, false;
    const float *ul = static_cast<const float *>(U.data), *sl = static_cast<const float *>(S.data),
                *vl = static_cast<const float *>(V.data);
    int64_t k = minDim - r;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < inF; ++i) {
        double d = 0;
        for (int64_t j = 0; j < r; ++j)
          d += double(ul[o * r + j]) * double(sl[j]) * double(vl[j * inF + i]) -
               f.u[size_t(o * minDim + k + j)] * f.s[size_t(k + j)] * f.v[size_t((k + j) * inF + i)];
        float &merged = mw.at(o, i);
        merged = float(double(merged) + d);
        if (!std::isfinite(merged))
          return error = req.adapterDir + ": merging module '" + m + "' overflows its weight", false;
      }
    if (!storeMerged(lm, req, m, *mw.use, *mw.tensor, mw.values, error)) return false;
  }
  return true;
}

// An IA3 adapter: each module's W scaled per output (its bias too), or per
// input on a feedforward module ([1, in] vectors), as PEFT's merge.
bool mergeIa3Adapter(LoadedModel &lm, const MergeRequest &req, const LoraConfig &cfg, const SafetensorsFile &file,
                     std::map<std::string, LinearUse> &linears, std::string &error) {
  ModuleTensors modules;
  if (!tensorsByModule(file, {kIa3Suffix}, "an IA3 vector", req, modules, error)) return false;
  for (auto &[m, parts] : modules) {
    const NamedTensor &t = *parts[0];
    ModuleWeight mw;
    if (!moduleWeight(lm, req, linears, m, mw, error)) return false;
    // The vector's shape tells its side ([1, in]: the input, a feedforward
    // module); the config's list decides only a 1 x 1 layer.
    bool inputSide = t.dims == Dims{1, mw.in} && (t.dims != Dims{mw.out, 1} || cfg.feedforwardByRule(m));
    Dims want = inputSide ? Dims{1, mw.in} : Dims{mw.out, 1};
    if (t.dtype != DType::F32 || t.dims != want)
      return error = req.adapterDir + ": module '" + m + "' needs an f32 ia3_l of [" + formatDims(Dims{1, mw.in}) +
                     "] (a feedforward module) or [" + formatDims(Dims{mw.out, 1}) + "], got " + dtypeName(t.dtype) +
                     "[" + formatDims(t.dims) + "]",
             false;
    const float *l = static_cast<const float *>(t.data);
    for (int64_t o = 0; o < mw.out; ++o)
      for (int64_t i = 0; i < mw.in; ++i) {
        float &w = mw.at(o, i);
        w *= inputSide ? l[i] : l[o];
        if (!std::isfinite(w)) return error = req.adapterDir + ": merging module '" + m + "' overflows its weight", false;
      }
    if (!inputSide && !mw.use->bias.empty()) {
      onnx::TensorProto *bt = findInitializer(lm.model, mw.use->bias);
      if (!bt) bt = untiedInitializer(lm.model, mw.use->bias);
      std::vector<float> bv;
      if (!bt || !floatsOf(*bt, bv) || int64_t(bv.size()) != mw.out)
        return error = req.model + ": bias '" + mw.use->bias + "' of module '" + m + "' is not an f32 initializer of " +
                       std::to_string(mw.out) + " values",
               false;
      bool changes = false;
      for (int64_t o = 0; o < mw.out; ++o) changes |= bv[size_t(o)] != 0 && l[o] != 1;
      if (changes && mw.use->biasShared)
        return error = req.model + ": bias '" + mw.use->bias + "' of module '" + m +
                       "' is read by other layers too, which IA3 does not scale",
               false;
      for (int64_t o = 0; o < mw.out; ++o) bv[size_t(o)] *= l[o];
      setFloats(*bt, bv);
    }
    if (!storeMerged(lm, req, m, *mw.use, *mw.tensor, mw.values, error)) return false;
  }
  return true;
}

// A LoHa adapter: W += (w1_a w1_b) ⊙ (w2_a w2_b) · alpha / r, as PEFT's merge.
bool mergeLohaAdapter(LoadedModel &lm, const MergeRequest &req, const LoraConfig &cfg, const SafetensorsFile &file,
                      std::map<std::string, LinearUse> &linears, std::string &error) {
  ModuleTensors modules;
  if (!tensorsByModule(file, {kLohaSuffixes[0], kLohaSuffixes[1], kLohaSuffixes[2], kLohaSuffixes[3]}, "a LoHa factor",
                       req, modules, error))
    return false;
  int64_t r = cfg.r;
  double scale = cfg.alpha / double(r);
  for (auto &[m, parts] : modules) {
    ModuleWeight mw;
    if (!moduleWeight(lm, req, linears, m, mw, error)) return false;
    for (int i = 0; i < 4; ++i) {
      Dims want = i % 2 == 0 ? Dims{mw.out, r} : Dims{r, mw.in};
      if (!parts[size_t(i)] || parts[size_t(i)]->dtype != DType::F32 || parts[size_t(i)]->dims != want)
        return error = req.adapterDir + ": module '" + m + "' needs f32 " + std::string(kLohaSuffixes[i] + 1) + " [" +
                       formatDims(want) + "]" + (parts[size_t(i)] ? ", got [" + formatDims(parts[size_t(i)]->dims) + "]" : ""),
               false;
    }
    auto data = [&](int i) { return static_cast<const float *>(parts[size_t(i)]->data); };
    const float *w1a = data(0), *w1b = data(1), *w2a = data(2), *w2b = data(3);
    for (int64_t o = 0; o < mw.out; ++o)
      for (int64_t i = 0; i < mw.in; ++i) {
        double p1 = 0, p2 = 0;
        for (int64_t k = 0; k < r; ++k) {
          p1 += double(w1a[o * r + k]) * double(w1b[k * mw.in + i]);
          p2 += double(w2a[o * r + k]) * double(w2b[k * mw.in + i]);
        }
        float &w = mw.at(o, i);
        w = float(double(w) + p1 * p2 * scale);
        if (!std::isfinite(w)) return error = req.adapterDir + ": merging module '" + m + "' overflows its weight", false;
      }
    if (!storeMerged(lm, req, m, *mw.use, *mw.tensor, mw.values, error)) return false;
  }
  return true;
}

// An AdaLoRA adapter: W += B (A * E) · alpha / (r + 1e-5), as PEFT's merge
// (a pruned triplet's E is 0).
bool mergeAdaloraAdapter(LoadedModel &lm, const MergeRequest &req, const LoraConfig &cfg, const SafetensorsFile &file,
                         std::map<std::string, LinearUse> &linears, std::string &error) {
  ModuleTensors modules;
  if (!tensorsByModule(file, {kAdaloraSuffixes[0], kAdaloraSuffixes[1], kAdaloraSuffixes[2]}, "an AdaLoRA factor", req,
                       modules, error))
    return false;
  int64_t r = cfg.r;
  double scale = double(float(cfg.alpha) / (float(r) + 1e-5f));
  for (auto &[m, parts] : modules) {
    ModuleWeight mw;
    if (!moduleWeight(lm, req, linears, m, mw, error)) return false;
    // A module PEFT cut to its kept triplets (rank_pattern) holds k <= r of them.
    int64_t k = r;
    if (auto cut = cfg.rankPattern.find(m); cut != cfg.rankPattern.end())
      k = std::count(cut->second.begin(), cut->second.end(), true);
    const Dims want[3] = {{k, mw.in}, {k, 1}, {mw.out, k}};
    for (int i = 0; i < 3; ++i)
      if (!parts[size_t(i)] || parts[size_t(i)]->dtype != DType::F32 || parts[size_t(i)]->dims != want[i])
        return error = req.adapterDir + ": module '" + m + "' needs f32 " + std::string(kAdaloraSuffixes[i] + 1) + " [" +
                       formatDims(want[i]) + "]" + (parts[size_t(i)] ? ", got [" + formatDims(parts[size_t(i)]->dims) + "]" : ""),
               false;
    auto data = [&](int i) { return static_cast<const float *>(parts[size_t(i)]->data); };
    const float *a = data(0), *e = data(1), *bm = data(2);
    for (int64_t o = 0; o < mw.out; ++o)
      for (int64_t i = 0; i < mw.in; ++i) {
        double d = 0;
        for (int64_t t = 0; t < k; ++t) d += double(bm[o * k + t]) * double(a[t * mw.in + i]) * double(e[t]);
        float &w = mw.at(o, i);
        w = float(double(w) + d * scale);
        if (!std::isfinite(w)) return error = req.adapterDir + ": merging module '" + m + "' overflows its weight", false;
      }
    if (!storeMerged(lm, req, m, *mw.use, *mw.tensor, mw.values, error)) return false;
  }
  return true;
}

// One LoKr factor of a module: whole (parts[whole]) or the product of its
// rank-r halves (parts[whole + 1] [rows, r] times parts[whole + 2] [r, cols]),
// in double, with its shape. False (and `error`) when neither form is there
// or it is larger than the module's [out, in] weight `mw`.
bool lokrFactor(const std::vector<const NamedTensor *> &parts, size_t whole, const std::string &m, int64_t r,
                const ModuleWeight &mw, const MergeRequest &req, std::vector<double> &out, Dims &dims,
                std::string &error) {
  auto f32 = [](const NamedTensor *t) { return t && t->dtype == DType::F32 && t->dims.size() == 2; };
  const NamedTensor *w = parts[whole], *wa = parts[whole + 1], *wb = parts[whole + 2];
  std::string name = std::string(kLokrSuffixes[whole] + 1);
  auto fits = [&] {
    if (dims[0] <= mw.out && dims[1] <= mw.in) return true;
    return error = req.adapterDir + ": module '" + m + "' has a LoKr factor " + name + " of [" + formatDims(dims) +
                   "], larger than its weight's [" + formatDims(Dims{mw.out, mw.in}) + "]",
           false;
  };
  if (f32(w) && !wa && !wb) {
    dims = w->dims;
    if (!fits()) return false;
    const float *v = static_cast<const float *>(w->data);
    out.assign(v, v + dims[0] * dims[1]);
    return true;
  }
  if (w || !f32(wa) || !f32(wb) || wa->dims[1] != r || wb->dims[0] != r)
    return error = req.adapterDir + ": module '" + m + "' needs an f32 " + name + " [rows, cols], or " + name + "_a [rows, " +
                   std::to_string(r) + "] and " + name + "_b [" + std::to_string(r) + ", cols] (r of adapter_config.json)",
           false;
  dims = {wa->dims[0], wb->dims[1]};
  if (!fits()) return false;
  const float *a = static_cast<const float *>(wa->data), *b = static_cast<const float *>(wb->data);
  out.assign(size_t(dims[0] * dims[1]), 0.0);
  for (int64_t i = 0; i < dims[0]; ++i)
    for (int64_t k = 0; k < r; ++k)
      for (int64_t j = 0; j < dims[1]; ++j) out[size_t(i * dims[1] + j)] += double(a[i * r + k]) * double(b[k * dims[1] + j]);
  return true;
}

// A LoKr adapter: W += kron(W1, W2) · alpha / r, as PEFT's merge.
bool mergeLokrAdapter(LoadedModel &lm, const MergeRequest &req, const LoraConfig &cfg, const SafetensorsFile &file,
                      std::map<std::string, LinearUse> &linears, std::string &error) {
  ModuleTensors modules;
  if (!tensorsByModule(file, std::vector<const char *>(std::begin(kLokrSuffixes), std::end(kLokrSuffixes)),
                       "a LoKr factor", req, modules, error))
    return false;
  double scale = cfg.alpha / double(cfg.r);
  for (auto &[m, parts] : modules) {
    ModuleWeight mw;
    if (!moduleWeight(lm, req, linears, m, mw, error)) return false;
    std::vector<double> w1, w2;
    Dims d1, d2;
    if (!lokrFactor(parts, 0, m, cfg.r, mw, req, w1, d1, error) || !lokrFactor(parts, 3, m, cfg.r, mw, req, w2, d2, error))
      return false;
    if (d1[0] * d2[0] != mw.out || d1[1] * d2[1] != mw.in)
      return error = req.adapterDir + ": module '" + m + "' has LoKr factors [" + formatDims(d1) + "] and [" +
                     formatDims(d2) + "], whose Kronecker product is not its weight's [" +
                     formatDims(Dims{mw.out, mw.in}) + "]",
             false;
    int64_t b = d2[0], d = d2[1];
    for (int64_t o = 0; o < mw.out; ++o)
      for (int64_t i = 0; i < mw.in; ++i) {
        float &w = mw.at(o, i);
        w = float(double(w) + w1[size_t((o / b) * d1[1] + i / d)] * w2[size_t((o % b) * d + i % d)] * scale);
        if (!std::isfinite(w)) return error = req.adapterDir + ": merging module '" + m + "' overflows its weight", false;
      }
    if (!storeMerged(lm, req, m, *mw.use, *mw.tensor, mw.values, error)) return false;
  }
  return true;
}

// A VeRA adapter: W += (λ_b ⊙ B[:out]) (λ_d ⊙ A[:, :in]), as PEFT's merge;
// the shared projections from the file, or drawn from projection_prng_key
// as PEFT draws them when it did not save them.
bool mergeVeraAdapter(LoadedModel &lm, const MergeRequest &req, const LoraConfig &cfg, const SafetensorsFile &file,
                      std::map<std::string, LinearUse> &linears, std::string &error) {
  const NamedTensor *shared[2] = {nullptr, nullptr};
  std::set<std::string> sharedKeys;
  for (int k = 0; k < 2; ++k) {
    sharedKeys.insert(adapterKey(kVeraProjections[k]));
    if (auto it = file.tensors.find(adapterKey(kVeraProjections[k])); it != file.tensors.end()) shared[k] = &it->second;
  }
  ModuleTensors modules;
  if (!tensorsByModule(file, {kVeraSuffixes[0], kVeraSuffixes[1]}, "a VeRA tensor", req, modules, error, sharedKeys))
    return false;
  int64_t r = cfg.r, maxIn = 0, maxOut = 0;
  std::map<std::string, ModuleWeight> weights;
  for (auto &[m, parts] : modules) {
    if (!moduleWeight(lm, req, linears, m, weights[m], error)) return false;
    maxIn = std::max(maxIn, weights[m].in);
    maxOut = std::max(maxOut, weights[m].out);
  }
  std::vector<float> a, b;
  if (shared[0] && shared[1]) {
    if (shared[0]->dtype != DType::F32 || shared[0]->dims != Dims{r, maxIn} || shared[1]->dtype != DType::F32 ||
        shared[1]->dims != Dims{maxOut, r})
      return error = req.adapterDir + ": vera_A and vera_B must be f32 [" + formatDims(Dims{r, maxIn}) + "] and [" +
                     formatDims(Dims{maxOut, r}) + "]",
             false;
    a.assign(static_cast<const float *>(shared[0]->data), static_cast<const float *>(shared[0]->data) + r * maxIn);
    b.assign(static_cast<const float *>(shared[1]->data), static_cast<const float *>(shared[1]->data) + maxOut * r);
  } else {
    std::mt19937 gen(static_cast<uint32_t>(cfg.projectionKey));
    a = torchUniformFloats(size_t(r * maxIn), std::sqrt(6.0 / double(maxIn)), gen);
    b = torchUniformFloats(size_t(maxOut * r), std::sqrt(6.0 / double(r)), gen);
  }
  for (auto &[m, parts] : modules) {
    ModuleWeight &mw = weights[m];
    if (!parts[0] || !parts[1] || parts[0]->dtype != DType::F32 || parts[1]->dtype != DType::F32 ||
        parts[0]->dims != Dims{mw.out} || parts[1]->dims != Dims{r})
      return error = req.adapterDir + ": module '" + m + "' needs f32 vera_lambda_b [" + std::to_string(mw.out) +
                     "] and vera_lambda_d [" + std::to_string(r) + "]",
             false;
    const float *lb = static_cast<const float *>(parts[0]->data), *ld = static_cast<const float *>(parts[1]->data);
    for (int64_t o = 0; o < mw.out; ++o)
      for (int64_t i = 0; i < mw.in; ++i) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double(b[size_t(o * r + k)]) * double(ld[k]) * double(a[size_t(k * maxIn + i)]);
        float &w = mw.at(o, i);
        w = float(double(w) + double(lb[o]) * d);
        if (!std::isfinite(w)) return error = req.adapterDir + ": merging module '" + m + "' overflows its weight", false;
      }
    if (!storeMerged(lm, req, m, *mw.use, *mw.tensor, mw.values, error)) return false;
  }
  return true;
}

// PEFT's bias (all, lora_only): the adapter's biases replace the model's own,
// keyed by the parameter's name (an adapted layer's as <module>.base_layer.bias).
// `keys` gets the keys merged.
bool mergeTrainedBiases(LoadedModel &lm, const MergeRequest &req, const SafetensorsFile &file,
                        std::set<std::string> &keys, std::string &error) {
  const std::string prefix = adapterKey(""), wrapped = ".base_layer.bias";
  for (auto &[key, t] : file.tensors) {
    StringRef k(key);
    if (!k.starts_with(prefix) || !k.ends_with(".bias") || k.contains("lora_")) continue;
    std::string name = key.substr(prefix.size());
    if (StringRef(name).ends_with(wrapped)) name = name.substr(0, name.size() - wrapped.size()) + ".bias";
    onnx::TensorProto *b = parameterInitializer(lm.model, name);
    if (!b) return error = req.adapterDir + ": bias '" + key + "' is not a parameter of " + req.model, false;
    if (!replaceValues(*b, t))
      return error = req.adapterDir + ": bias '" + key + "' is " + dtypeName(t.dtype) + "[" + formatDims(t.dims) +
                     "], the model's '" + name + "' has another type or shape",
             false;
    keys.insert(key);
  }
  return true;
}

// PiSSA, OLoRA and LoftQ adapters fit the base weight their start left: W
// is replaced by it (from the same LoraBaseStart sdc compile ran), as PEFT
// redoes the start when it loads such an adapter onto the original model.
bool rebuildStartedBase(const MergeRequest &req, const LoraConfig &cfg, const std::string &m, ModuleWeight &mw,
                        std::string &error) {
  if (cfg.fanInFanOut && cfg.baseInit != "pissa")
    return error = req.adapterDir + ": init_lora_weights '" + cfg.baseInit + "' on module '" + m +
                   "', whose weight is stored [in, out]: PEFT's " + cfg.baseInit + " reads it as [out, in]",
           false;
  std::vector<float> w(size_t(mw.out * mw.in));
  for (int64_t o = 0; o < mw.out; ++o)
    for (int64_t i = 0; i < mw.in; ++i) w[size_t(o * mw.in + i)] = mw.at(o, i);
  LoraBaseStart start;
  std::string why;
  if (!loraBaseStart(cfg.baseInit, w, mw.out, mw.in, cfg.r, cfg.scale(), cfg.loftqIter, start, why))
    return error = req.adapterDir + ": rebuilding module '" + m + "''s " + cfg.baseInit + " base weight: " + why, false;
  for (int64_t o = 0; o < mw.out; ++o)
    for (int64_t i = 0; i < mw.in; ++i) mw.at(o, i) = start.base[size_t(o * mw.in + i)];
  return true;
}

bool mergeAdapter(LoadedModel &lm, const MergeRequest &req, std::string &error) {
  auto cfg = readAdapterConfig(req.adapterDir);
  if (!cfg.isOk()) return error = cfg.status().message(), false;
  if (!cfg.value().modulesToSave.empty())
    return error = req.adapterDir + ": the adapter trains '" + cfg.value().modulesToSave[0] +
                   "' in full (modules_to_save, a classification head the model does not have); sdc merge folds "
                   "LoRA, DoRA, OSF, IA3, LoHa, LoKr and VeRA weights into the model's own layers only",
           false;
  if (cfg.value().isPromptTuning() || cfg.value().isPrefixTuning())
    return error = req.adapterDir + ": a " + cfg.value().kindName() + " adapter puts trained virtual tokens before " +
                   "the input and changes no weight, so there is nothing to merge; run it with sdrun infer --adapter",
           false;
  if (cfg.value().isBottleneck())
    return error = req.adapterDir + ": a " + cfg.value().kindName() + " adds layers with an activation between " +
                   "them, which no weight of the model can hold; run it with sdrun infer --adapter",
           false;
  if (req.adapterRank > 0 && (!cfg.value().isLora() || cfg.value().useDora || !cfg.value().baseInit.empty()))
    return error = req.adapterDir + ": --adapter-rank merges a LoRA's first ranks (a DyLoRA adapter at that rank); " +
                   "this adapter is " + cfg.value().kindName() +
                   (cfg.value().baseInit.empty() ? "" : " started from the base weights (" + cfg.value().baseInit + ")"),
           false;
  if (req.adapterRank > cfg.value().r)
    return error = req.adapterDir + ": --adapter-rank " + std::to_string(req.adapterRank) + " is above the adapter's r " +
                   std::to_string(cfg.value().r),
           false;
  // The ranks merged: all, or the first --adapter-rank (alpha over those).
  const int64_t used = req.adapterRank > 0 ? req.adapterRank : cfg.value().r;
  double scale = loraScale(cfg.value().alpha, used, cfg.value().rslora);
  auto file = readSafetensors(req.adapterDir + "/" + kAdapterWeightsFile, /*requireFinite=*/true);
  if (!file.isOk()) return error = file.status().message(), false;
  std::map<std::string, LinearUse> linears;
  if (!linearModules(lm, req.model, linears, error)) return false;
  if (cfg.value().isOsf()) return mergeOsfAdapter(lm, req, file.value(), linears, error);
  if (cfg.value().isIa3()) return mergeIa3Adapter(lm, req, cfg.value(), file.value(), linears, error);
  if (cfg.value().isLoha()) return mergeLohaAdapter(lm, req, cfg.value(), file.value(), linears, error);
  if (cfg.value().isLokr()) return mergeLokrAdapter(lm, req, cfg.value(), file.value(), linears, error);
  if (cfg.value().isVera()) return mergeVeraAdapter(lm, req, cfg.value(), file.value(), linears, error);
  if (cfg.value().isAdalora()) return mergeAdaloraAdapter(lm, req, cfg.value(), file.value(), linears, error);
  bool dora = cfg.value().useDora;
  std::vector<const char *> suffixes = {kLoraASuffix, kLoraBSuffix};
  if (dora) suffixes.push_back(kDoraMagnitudeSuffix);
  std::set<std::string> biases;
  if (cfg.value().bias != "none" && !mergeTrainedBiases(lm, req, file.value(), biases, error)) return false;
  ModuleTensors modules;
  if (!tensorsByModule(file.value(), suffixes, dora ? "a DoRA weight" : "a LoRA weight", req, modules, error, biases))
    return false;
  for (auto &[m, parts] : modules) {
    ModuleWeight mw;
    if (!moduleWeight(lm, req, linears, m, mw, error)) return false;
    if (!parts[0] || !parts[1]) return error = req.adapterDir + ": module '" + m + "' lacks lora_A or lora_B", false;
    const NamedTensor *magnitudeTensor = dora ? parts[2] : nullptr;
    if (dora && !magnitudeTensor)
      return error = req.adapterDir + ": module '" + m + "' lacks lora_magnitude_vector", false;
    int64_t out = mw.out, inF = mw.in;
    const NamedTensor &A = *parts[0], &B = *parts[1];
    int64_t rank = cfg.value().r;
    if (A.dtype != DType::F32 || B.dtype != DType::F32 || A.dims != Dims{rank, inF} || B.dims != Dims{out, rank})
      return error = req.adapterDir + ": module '" + m + "' needs lora_A [" + std::to_string(rank) + "x" +
                     std::to_string(inF) + "] and lora_B [" + std::to_string(out) + "x" + std::to_string(rank) +
                     "] f32, got " + formatDims(A.dims) + " and " + formatDims(B.dims),
             false;
    if (dora && (magnitudeTensor->dtype != DType::F32 || magnitudeTensor->dims != Dims{out}))
      return error = req.adapterDir + ": module '" + m + "' needs lora_magnitude_vector [" + std::to_string(out) +
                     "] f32, got " + formatDims(magnitudeTensor->dims),
             false;
    if (!cfg.value().baseInit.empty() && !rebuildStartedBase(req, cfg.value(), m, mw, error)) return false;
    const float *a = static_cast<const float *>(A.data), *bm = static_cast<const float *>(B.data);
    // W + scale B A, [out, in]; DoRA then scales each output row to its
    // magnitude: m / |W + scale B A|_row (PEFT's merge).
    std::vector<double> merged(size_t(out * inF));
    std::vector<double> rowNorm(size_t(out), 0.0);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < inF; ++i) {
        double d = 0;
        for (int64_t k = 0; k < used; ++k) d += double(bm[o * rank + k]) * double(a[k * inF + i]);
        double &v = merged[size_t(o * inF + i)];
        v = double(mw.at(o, i)) + scale * d;
        rowNorm[size_t(o)] += v * v;
      }
    const float *magnitude = dora ? static_cast<const float *>(magnitudeTensor->data) : nullptr;
    for (int64_t o = 0; o < out; ++o) {
      double factor = magnitude ? double(magnitude[o]) / std::sqrt(rowNorm[size_t(o)]) : 1.0;
      for (int64_t i = 0; i < inF; ++i) {
        float &w = mw.at(o, i);
        w = float(factor * merged[size_t(o * inF + i)]);
        if (!std::isfinite(w))
          return error = req.adapterDir + ": merging module '" + m + "' overflows its weight (lora_alpha " +
                         std::to_string(cfg.value().alpha) + ", r " + std::to_string(rank) +
                         (dora ? ", or a zero row norm" : "") + ")",
                 false;
      }
    }
    if (!storeMerged(lm, req, m, *mw.use, *mw.tensor, mw.values, error)) return false;
  }
  return true;
}

// A TorchScript export in eval mode keeps one initializer per distinct value
// and reads a parameter equal to an earlier one (a zero bias) through an
// Identity named after it; training gave that parameter values of its own
// (the importer unties it too). Turns such an Identity into an initializer of
// its own; null when `name` is no Identity of an initializer.
onnx::TensorProto *untiedInitializer(onnx::ModelProto &m, const std::string &name) {
  auto *nodes = m.mutable_graph()->mutable_node();
  for (int i = 0; i < nodes->size(); ++i) {
    const onnx::NodeProto &n = nodes->Get(i);
    if (n.op_type() != "Identity" || !n.domain().empty() || n.output_size() != 1 || n.output(0) != name ||
        n.input_size() != 1)
      continue;
    const onnx::TensorProto *source = findInitializer(m, n.input(0));
    if (!source) return nullptr;
    onnx::TensorProto copy = *source;
    copy.set_name(name);
    nodes->DeleteSubrange(i, 1);
    *m.mutable_graph()->add_initializer() = std::move(copy);
    return findInitializer(m, name);
  }
  return nullptr;
}

bool mergeWeights(LoadedModel &lm, const MergeRequest &req, std::string &error) {
  auto file = readSafetensors(req.weightsFile, /*requireFinite=*/true);
  if (!file.isOk()) return error = file.status().message(), false;
  // Training took apart what torch.onnx.export's optimizer merged (restored
  // biases, untied parameters, refolded copies: ExportRepairs), and saved the
  // weights under those names; the model gets the same repairs first.
  ExportRepairs repairs = exportRepairs(lm.model, torchParameters(lm.model));
  repairModel(lm.model, repairs);
  // A tied parameter's other names (the embedding's weight of a tied LM
  // head): sdrun saves it under each, Hugging Face's save_pretrained under
  // one of them; every copy must hold the same values.
  std::map<std::string, std::string> tiedTo;
  for (const auto &[param, names] : repairs.tiedNames)
    for (const std::string &n : names) tiedTo[n] = param;
  const auto &tensors = file.value().tensors;
  for (auto &[name, t] : tensors) {
    auto tie = tiedTo.find(name);
    if (tie != tiedTo.end())
      if (auto same = tensors.find(tie->second); same != tensors.end()) {
        if (same->second.bytes != t.bytes || std::memcmp(same->second.data, t.data, t.bytes))
          return error = req.weightsFile + ": '" + name + "' and '" + tie->second +
                         "' are one tied parameter of the model but hold different values",
                 false;
        continue; // merged under the parameter's name
      }
    const std::string &param = tie != tiedTo.end() ? tie->second : name;
    onnx::TensorProto *w = parameterInitializer(lm.model, param);
    if (!w) return error = req.weightsFile + ": '" + name + "' is not an initializer of " + req.model, false;
    if (!replaceValues(*w, t))
      return error = req.weightsFile + ": '" + name + "' is " + dtypeName(t.dtype) + "[" + formatDims(t.dims) +
                     "], the model has a different type or shape",
             false;
  }
  return true;
}

} // namespace

bool mergeModel(const MergeRequest &req, std::string &error) {
  LoadedModel lm;
  if (!loadOnnxModel(req.model, lm, error)) return false;
  if (!req.weightsFile.empty() && !mergeWeights(lm, req, error)) return false;
  if (!req.adapterDir.empty() && !mergeAdapter(lm, req, error)) return false;
  for (auto &t : *lm.model.mutable_graph()->mutable_initializer()) t.clear_data_location(), t.clear_external_data();
  std::string bytes;
  if (!lm.model.SerializeToString(&bytes)) return error = req.output + ": the merged model is too large to serialize", false;
  Status st = writeFileAtomic(req.output, bytes);
  if (!st.isOk()) return error = st.message(), false;
  return true;
}

} // namespace sd
