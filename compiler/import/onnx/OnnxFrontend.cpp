// ONNX loading with libonnx; every libonnx/protobuf exception stops here.
#include "OnnxFrontend.h"
#include "Sha256.h"
#include "onnx/checker.h"
#include "onnx/defs/parser.h"
#include "onnx/defs/schema.h"
#include "onnx/shape_inference/implementation.h"
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <sys/stat.h>

namespace sd {
namespace {

bool readFile(const std::string &path, std::string &out, std::string &error) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return error = path + ": no such file", false;
  if (!S_ISREG(st.st_mode)) return error = path + ": not a regular file", false;
  std::ifstream f(path, std::ios::binary);
  if (!f) return error = path + ": cannot open", false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

// External data must stay inside the model's folder: relative, no "..", and
// its real path (symlinks resolved) under the folder's real path.
bool loadExternal(onnx::TensorProto &t, const std::string &dir, const std::string &what, std::string &error) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto &kv : t.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = std::atoll(kv.value().c_str());
    else if (kv.key() == "length") length = std::atoll(kv.value().c_str());
  }
  std::string ctx = what + ": initializer '" + t.name() + "': external data ";
  if (location.empty()) return error = ctx + "has no location", false;
  if (location[0] == '/' || location.find("..") != std::string::npos)
    return error = ctx + "location '" + location + "' escapes the model folder", false;
  char realDir[PATH_MAX], realFile[PATH_MAX];
  std::string full = dir + "/" + location;
  if (!realpath(dir.c_str(), realDir)) return error = ctx + "folder cannot be resolved", false;
  if (!realpath(full.c_str(), realFile)) return error = ctx + "file '" + location + "' not found", false;
  std::string rd(realDir), rf(realFile);
  if (rf.compare(0, rd.size() + 1, rd + "/") != 0)
    return error = ctx + "location '" + location + "' escapes the model folder", false;
  std::ifstream f(rf, std::ios::binary | std::ios::ate);
  if (!f) return error = ctx + "file '" + location + "' cannot be read", false;
  int64_t size = int64_t(f.tellg());
  if (offset < 0 || offset > size) return error = ctx + "offset is outside the file", false;
  if (length < 0) length = size - offset;
  if (length > size - offset) return error = ctx + "range is outside the file", false;
  std::string data(size_t(length), '\0');
  f.seekg(offset);
  f.read(data.data(), length);
  if (!f) return error = ctx + "read failed", false;
  t.set_raw_data(std::move(data));
  t.clear_external_data();
  t.set_data_location(onnx::TensorProto::DEFAULT);
  return true;
}

// Inlines calls to model-local functions, renaming internal values per call.
bool inlineFunctions(onnx::ModelProto &m, std::string &error) {
  std::map<std::pair<std::string, std::string>, const onnx::FunctionProto *> fns;
  for (const auto &f : m.functions()) fns[{f.domain(), f.name()}] = &f;
  if (fns.empty()) return true;
  int counter = 0;
  std::function<bool(const google::protobuf::RepeatedPtrField<onnx::NodeProto> &,
                     google::protobuf::RepeatedPtrField<onnx::NodeProto> &, int)>
      expand = [&](const auto &in, auto &out, int depth) -> bool {
    for (const onnx::NodeProto &n : in) {
      auto it = fns.find({n.domain(), n.op_type()});
      if (it == fns.end()) {
        *out.Add() = n;
        continue;
      }
      if (depth > 16) return error = "model-local function '" + n.op_type() + "' recurses too deeply", false;
      const onnx::FunctionProto &fn = *it->second;
      std::string prefix = "__inl" + std::to_string(counter++) + "_" + n.name() + "/";
      std::map<std::string, std::string> rename;
      for (int i = 0; i < fn.input_size(); ++i) rename[fn.input(i)] = i < n.input_size() ? n.input(i) : "";
      for (int i = 0; i < fn.output_size(); ++i) rename[fn.output(i)] = i < n.output_size() ? n.output(i) : "";
      std::map<std::string, const onnx::AttributeProto *> callAttrs;
      for (const auto &a : n.attribute()) callAttrs[a.name()] = &a;
      google::protobuf::RepeatedPtrField<onnx::NodeProto> body;
      for (const onnx::NodeProto &bn : fn.node()) {
        onnx::NodeProto c = bn;
        c.set_name(prefix + bn.name());
        auto map = [&](const std::string &v) {
          if (v.empty()) return v;
          auto r = rename.find(v);
          return r != rename.end() ? r->second : prefix + v;
        };
        for (int i = 0; i < c.input_size(); ++i) c.set_input(i, map(c.input(i)));
        for (int i = 0; i < c.output_size(); ++i) c.set_output(i, map(c.output(i)));
        google::protobuf::RepeatedPtrField<onnx::AttributeProto> attrs;
        for (const auto &a : c.attribute()) {
          if (a.ref_attr_name().empty()) {
            *attrs.Add() = a;
          } else if (auto r = callAttrs.find(a.ref_attr_name()); r != callAttrs.end()) {
            onnx::AttributeProto v = *r->second;
            v.set_name(a.name());
            *attrs.Add() = v;
          }
        }
        c.mutable_attribute()->Swap(&attrs);
        *body.Add() = c;
      }
      if (!expand(body, out, depth + 1)) return false;
    }
    return true;
  };
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  if (!expand(m.graph().node(), nodes, 0)) return false;
  m.mutable_graph()->mutable_node()->Swap(&nodes);
  m.clear_functions();
  return true;
}

// libonnx 1.12's text parser accepts only C identifiers, but exporters name
// values "blocks.0.attn.qkv.weight" or "/blocks.0/attn/MatMul_output_0". We
// accept such names in backticks, swap them for placeholders before parsing and
// restore them after.
bool replaceQuotedNames(const std::string &in, std::string &out, std::vector<std::string> &names, std::string &error) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '`') {
      out += in[i];
      continue;
    }
    size_t end = in.find('`', i + 1);
    if (end == std::string::npos) return error = "unterminated `name`", false;
    out += "__sdq" + std::to_string(names.size()) + "__";
    names.push_back(in.substr(i + 1, end - i - 1));
    i = end;
  }
  return true;
}

void restoreQuotedNames(onnx::ModelProto &m, const std::vector<std::string> &names) {
  if (names.empty()) return;
  auto fix = [&](std::string *s) {
    if (s->rfind("__sdq", 0) != 0) return;
    size_t idx = size_t(std::atoll(s->c_str() + 5));
    if (idx < names.size() && *s == "__sdq" + std::to_string(idx) + "__") *s = names[idx];
  };
  auto *g = m.mutable_graph();
  for (auto &v : *g->mutable_input()) fix(v.mutable_name());
  for (auto &v : *g->mutable_output()) fix(v.mutable_name());
  for (auto &v : *g->mutable_value_info()) fix(v.mutable_name());
  for (auto &t : *g->mutable_initializer()) fix(t.mutable_name());
  for (auto &n : *g->mutable_node()) {
    fix(n.mutable_name());
    for (auto &x : *n.mutable_input()) fix(&x);
    for (auto &x : *n.mutable_output()) fix(&x);
  }
}

// libonnx 1.12's shape inference reads a node's required attributes without
// looking (Scan's num_scan_inputs: a null dereference), where the checker,
// whose complaints only become notes, would have said. So a node of a
// standard op lacking a required attribute, or holding a required graph as
// something else, is refused before shape inference runs. Subgraphs too.
bool requiredAttributesPresent(const onnx::GraphProto &g, int64_t opset, std::string &error) {
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &n = g.node(i);
    for (const onnx::AttributeProto &a : n.attribute()) {
      if (a.has_g() && !requiredAttributesPresent(a.g(), opset, error)) return false;
      for (const onnx::GraphProto &sub : a.graphs())
        if (!requiredAttributesPresent(sub, opset, error)) return false;
    }
    if (!n.domain().empty() && n.domain() != "ai.onnx") continue;
    const onnx::OpSchema *schema = onnx::OpSchemaRegistry::Schema(n.op_type(), int(opset), "");
    if (!schema) continue;
    for (const auto &attribute : schema->attributes()) {
      const std::string &name = attribute.first;
      const onnx::OpSchema::Attribute &spec = attribute.second;
      if (!spec.required) continue;
      auto a = std::find_if(n.attribute().begin(), n.attribute().end(),
                            [&](const onnx::AttributeProto &x) { return x.name() == name; });
      std::string node = (n.name().empty() ? "node #" + std::to_string(i) : "node '" + n.name() + "'") + " (" +
                         n.op_type() + ")";
      if (a == n.attribute().end()) return error = node + " lacks its required attribute '" + name + "'", false;
      if (spec.type == onnx::AttributeProto::GRAPH && !a->has_g())
        return error = node + ": attribute '" + name + "' must be a graph", false;
    }
  }
  return true;
}

} // namespace

bool loadOnnxModelFromBytes(const std::string &bytes, bool textFormat, const std::string &what, const std::string &dir,
                            LoadedModel &out, std::string &error) {
  try {
    out.path = what;
    out.dir = dir;
    out.sha256 = sha256(bytes.data(), bytes.size());
    if (bytes.empty()) return error = what + ": empty file", false;
    if (textFormat) {
      std::string text;
      std::vector<std::string> names;
      if (!replaceQuotedNames(bytes, text, names, error)) return error = what + ": " + error, false;
      auto status = onnx::OnnxParser::Parse(out.model, text.c_str());
      if (!status.IsOK()) {
        std::string msg = status.ErrorMessage();
        std::replace(msg.begin(), msg.end(), '\n', ' ');
        return error = what + ": cannot parse ONNX text: " + msg, false;
      }
      restoreQuotedNames(out.model, names);
    } else if (!out.model.ParseFromString(bytes)) {
      return error = what + ": not a valid ONNX model (protobuf parse failed)", false;
    }
    if (!out.model.has_graph()) return error = what + ": model has no graph", false;
    if (out.model.ir_version() <= 0) return error = what + ": model has no IR version", false;
    for (auto &t : *out.model.mutable_graph()->mutable_initializer())
      if (t.data_location() == onnx::TensorProto::EXTERNAL && !loadExternal(t, dir, what, error)) return false;
    if (!inlineFunctions(out.model, error)) return error = what + ": " + error, false;
    try {
      onnx::checker::check_model(out.model);
    } catch (const std::exception &e) {
      out.notes.push_back(std::string("onnx checker: ") + e.what());
    }
    int64_t opset = 0;
    for (const onnx::OperatorSetIdProto &o : out.model.opset_import())
      if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
    if (!requiredAttributesPresent(out.model.graph(), opset, error)) return error = what + ": " + error, false;
    try {
      onnx::shape_inference::InferShapes(out.model);
    } catch (const std::exception &e) {
      out.notes.push_back(std::string("onnx shape inference: ") + e.what());
    }
    return true;
  } catch (const std::exception &e) {
    return error = what + ": " + e.what(), false;
  } catch (...) {
    return error = what + ": unknown error while reading the model", false;
  }
}

bool loadTensorProto(const std::string &path, onnx::TensorProto &out, std::string &error) {
  std::string bytes;
  if (!readFile(path, bytes, error)) return false;
  try {
    if (bytes.empty() || !out.ParseFromString(bytes)) return error = path + ": not a TensorProto file", false;
    if (out.data_location() == onnx::TensorProto::EXTERNAL) return error = path + ": external data is not allowed", false;
  } catch (const std::exception &e) {
    return error = path + ": " + e.what(), false;
  }
  return true;
}

bool loadOnnxModel(const std::string &path, LoadedModel &out, std::string &error) {
  std::string bytes;
  if (!readFile(path, bytes, error)) return false;
  std::string dir = ".";
  if (size_t s = path.find_last_of('/'); s != std::string::npos) dir = path.substr(0, s);
  bool text = path.size() > 8 && path.compare(path.size() - 8, 8, ".onnxtxt") == 0;
  return loadOnnxModelFromBytes(bytes, text, path, dir, out, error);
}

} // namespace sd
