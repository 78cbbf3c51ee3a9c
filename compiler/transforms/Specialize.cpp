// sd-specialize: clone each entry once per shape bucket with static inputs.
#include "sd/format/training_abi.h"
#include "KernelFold.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include <map>
#include <set>

namespace sd {
#define GEN_PASS_DEF_SPECIALIZE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;

// "x=2x128,4x128" -> ("x", [[2,128],[4,128]]); dims "seq=128,256" -> ("seq", [[128],[256]]).
LogicalResult sd::parseBinding(StringRef text, bool isShape, std::string &name,
                           std::vector<std::vector<int64_t>> &values, std::string &err) {
  auto [n, rest] = text.rsplit('=');
  if (n.empty() || rest.empty() || !text.contains('=')) {
    err = "expected NAME=" + std::string(isShape ? "DxD" : "N") + ", got '" + text.str() + "'";
    return failure();
  }
  name = n.str();
  SmallVector<StringRef> alts;
  rest.split(alts, ',');
  for (StringRef alt : alts) {
    std::vector<int64_t> dims;
    SmallVector<StringRef> parts;
    if (isShape && alt != "scalar") alt.split(parts, 'x');
    else if (!isShape) parts.push_back(alt);
    for (StringRef p : parts) {
      int64_t v;
      if (p.trim().getAsInteger(10, v) || v < 0 || v > (int64_t(1) << 40)) {
        err = "bad dimension '" + p.str() + "' in '" + text.str() + "'";
        return failure();
      }
      dims.push_back(v);
    }
    values.push_back(std::move(dims));
  }
  return success();
}

namespace {

struct SpecializePass : sd::impl::SpecializeBase<SpecializePass> {
  using SpecializeBase::SpecializeBase;

  using Bindings = std::map<std::string, std::vector<std::vector<int64_t>>>;
  struct BucketSpec {
    Bindings shapeOpts, dimOpts;
    size_t buckets = 1;
    const char *shapesFlag = "--shapes"; // the flag the shapes came from, for errors
    // Inputs whose dim 0 is the default batch 1 of a training plan's infer
    // entry, not a user's choice: it yields to a batch the model fixes.
    std::set<std::string> defaultBatch;
  };

  LogicalResult parseSpec(ModuleOp module, ArrayRef<std::string> shapeList, ArrayRef<std::string> dimList,
                          BucketSpec &spec) {
    auto collect = [&](ArrayRef<std::string> opts, bool isShape, Bindings &into) -> LogicalResult {
      for (const std::string &o : opts) {
        std::string name, err;
        std::vector<std::vector<int64_t>> vals;
        if (failed(sd::parseBinding(o, isShape, name, vals, err))) return module.emitError(err);
        auto &dst = into[name];
        dst.insert(dst.end(), vals.begin(), vals.end());
      }
      return success();
    };
    if (failed(collect(shapeList, true, spec.shapeOpts)) || failed(collect(dimList, false, spec.dimOpts)))
      return failure();
    for (auto *m : {&spec.shapeOpts, &spec.dimOpts})
      for (auto &[name, vals] : *m) spec.buckets = std::max(spec.buckets, vals.size());
    for (auto *m : {&spec.shapeOpts, &spec.dimOpts})
      for (auto &[name, vals] : *m)
        if (vals.size() != 1 && vals.size() != spec.buckets)
          return module.emitError() << "'" << name << "' has " << vals.size() << " values but other bindings give "
                                    << spec.buckets << " buckets; give 1 or " << spec.buckets;
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // Training plans give `infer` buckets of its own (batch 1 for generation).
    BucketSpec spec, inferSpec;
    if (failed(parseSpec(module, shapes, dims, spec)) ||
        failed(parseSpec(module, inferShapes.empty() ? ArrayRef<std::string>(shapes) : ArrayRef<std::string>(inferShapes),
                         dims, inferSpec)))
      return signalPassFailure();
    if (!inferShapes.empty()) inferSpec.shapesFlag = "--infer-shapes";
    if (inferShapes.empty() && inferBatchOne)
      for (auto &[name, alts] : inferSpec.shapeOpts)
        for (std::vector<int64_t> &alt : alts)
          if (alt.size() >= 2) {
            alt[0] = 1;
            inferSpec.defaultBatch.insert(name);
          }

    SmallVector<func::FuncOp> entries;
    for (auto f : module.getOps<func::FuncOp>())
      if (sd::isEntry(f) && !f->hasAttr("sd.bucket")) entries.push_back(f);
    std::set<std::string> usedShapes, usedDims;
    // The model's own inputs (infer's), to name in an error about --shapes.
    std::string modelInputs;
    for (func::FuncOp f : entries)
      if (f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kInfer)
        for (unsigned i = 0; i < f.getNumArguments(); ++i) {
          auto name = f.getArgAttrOfType<StringAttr>(i, "sd.name");
          modelInputs += (modelInputs.empty() ? "" : ", ") + (name ? name.str() : "input" + std::to_string(i));
        }
    for (func::FuncOp f : entries) {
      if (auto kv = f->getAttrOfType<DenseI64ArrayAttr>("sd.kv_shape")) { // sd-kv-entries' generation entries
        BucketSpec gen;
        gen.shapesFlag = "--kv-batch/--prefill-chunk/--kv-cache";
        std::vector<int64_t> shape(kv.asArrayRef().begin(), kv.asArrayRef().end());
        gen.shapeOpts[f->getAttrOfType<StringAttr>("sd.kv_token_input").str()] = {shape};
        for (unsigned i = 0; i < f.getNumArguments(); ++i)
          if (auto name = f.getArgAttrOfType<StringAttr>(i, "sd.name"); name && name.getValue() == sd::abi::kPositionIds)
            gen.shapeOpts[sd::abi::kPositionIds] = {shape};
        std::set<std::string> ignored;
        if (failed(specialize(f, 0, gen, ignored, ignored))) return signalPassFailure();
        f.erase();
        continue;
      }
      BucketSpec &use = f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kInfer ? inferSpec : spec;
      for (size_t b = 0; b < use.buckets; ++b)
        if (failed(specialize(f, b, use, usedShapes, usedDims)))
          return signalPassFailure();
      f.erase();
    }
    for (auto &[name, v] : spec.shapeOpts)
      if (!usedShapes.count(name)) {
        module.emitError() << "--shapes names '" << name << "', which is not a model input"
                           << (modelInputs.empty() ? std::string() : " (the model's inputs: " + modelInputs + ")");
        return signalPassFailure();
      }
    for (auto &[name, v] : spec.dimOpts)
      if (!usedDims.count(name)) {
        module.emitError() << "--dim names '" << name << "', which no model input uses";
        return signalPassFailure();
      }
  }

  // "A + B + 3" from integers and dims set by --dim or by inputs already
  // specialized; dynamic when a term is not known.
  static int64_t sumOfDims(StringRef expr, size_t b, BucketSpec &use, const std::map<std::string, int64_t> &bucket,
                           std::set<std::string> &usedDims) {
    SmallVector<StringRef> terms;
    expr.split(terms, '+');
    int64_t total = 0;
    for (StringRef t : terms) {
      t = t.trim();
      int64_t v;
      if (!t.getAsInteger(10, v)) {
        total += v;
      } else if (auto it = use.dimOpts.find(t.str()); it != use.dimOpts.end()) {
        usedDims.insert(t.str());
        total += (it->second.size() == 1 ? it->second[0] : it->second[b])[0];
      } else if (auto known = bucket.find(t.str()); known != bucket.end()) {
        total += known->second;
      } else {
        return ShapedType::kDynamic;
      }
    }
    return total;
  }

  LogicalResult specialize(func::FuncOp f, size_t b, BucketSpec &use, std::set<std::string> &usedShapes,
                           std::set<std::string> &usedDims) {
    Bindings &shapeOpts = use.shapeOpts, &dimOpts = use.dimOpts;
    size_t buckets = use.buckets;
    auto isDefault = [&](const std::string &input, size_t d) { return d == 0 && use.defaultBatch.count(input); };
    auto defaultNote = [&](const std::string &input, size_t d) {
      return isDefault(input, d) ? std::string(" (the infer entry's default batch 1; set its shapes with --infer-shapes ") +
                                       input + "=DxD)"
                                 : std::string();
    };
    OpBuilder builder(f);
    std::string entry = f->getAttrOfType<StringAttr>("sd.entry").str();
    auto clone = cast<func::FuncOp>(builder.clone(*f));
    clone.setName(buckets == 1 ? f.getName().str() : (f.getName() + "_b" + std::to_string(b)).str());
    std::map<std::string, int64_t> bucket; // dim_param -> value
    Block &body = clone.getBody().front();
    SmallVector<Type> argTypes;
    for (unsigned i = 0; i < clone.getNumArguments(); ++i) {
      auto argType = cast<TensorType>(clone.getArgument(i).getType());
      auto nameAttr = clone.getArgAttrOfType<StringAttr>(i, "sd.name");
      std::string name = nameAttr ? nameAttr.str() : "input" + std::to_string(i);
      auto params = clone.getArgAttrOfType<ArrayAttr>(i, "sd.dim_params");
      auto it = shapeOpts.find(name);
      // An input the model gives no shape takes its rank from --shapes.
      if (!argType.hasRank() && it == shapeOpts.end())
        return f.emitError() << "input '" << name << "' has no shape in the model; give --shapes " << name << "=DxD";
      SmallVector<int64_t> shape;
      if (argType.hasRank()) shape.assign(argType.getShape().begin(), argType.getShape().end());
      else shape.assign((it->second.size() == 1 ? it->second[0] : it->second[b]).size(), ShapedType::kDynamic);
      if (it != shapeOpts.end()) {
        usedShapes.insert(name);
        const auto &want = it->second.size() == 1 ? it->second[0] : it->second[b];
        if (want.size() != shape.size())
          return f.emitError() << use.shapesFlag << " " << name << " has rank " << want.size() << " but the model's input '"
                               << name << "' has rank " << shape.size();
        for (size_t d = 0; d < shape.size(); ++d) {
          if (!ShapedType::isDynamic(shape[d]) && shape[d] != want[d]) {
            if (isDefault(name, d)) continue; // the model admits only its own batch
            return f.emitError() << use.shapesFlag << " " << name << " sets dim " << d << " to " << want[d]
                                 << " but the model fixes it at " << shape[d];
          }
          shape[d] = want[d]; // dynamic, or already equal
        }
      }
      for (size_t d = 0; d < shape.size(); ++d) {
        StringRef param;
        if (params && d < params.size())
          if (auto s = dyn_cast<StringAttr>(params[d])) param = s.getValue();
        if (!param.empty()) {
          auto it = dimOpts.find(param.str());
          if (it != dimOpts.end()) {
            usedDims.insert(param.str());
            int64_t v = (it->second.size() == 1 ? it->second[0] : it->second[b])[0];
            if (!ShapedType::isDynamic(shape[d]) && shape[d] != v && !isDefault(name, d))
              return f.emitError() << "--dim " << param << "=" << v << " contradicts input '" << name
                                   << "' dim " << d << " = " << shape[d];
            if (!isDefault(name, d) || !argType.hasRank() || argType.isDynamicDim(d)) shape[d] = v;
          }
          // A dim_param another input already fixed (labels share input_ids' batch and seq).
          if (ShapedType::isDynamic(shape[d]) && bucket.count(param.str())) shape[d] = bucket[param.str()];
          // An exporter's sum of dims (Optimum's attention_mask: "past_sequence_length + sequence_length").
          if (ShapedType::isDynamic(shape[d]) && param.contains('+')) shape[d] = sumOfDims(param, b, use, bucket, usedDims);
          if (!ShapedType::isDynamic(shape[d])) {
            auto [it2, inserted] = bucket.emplace(param.str(), shape[d]);
            if (!inserted && it2->second != shape[d])
              return f.emitError() << "dim '" << param << "' is " << it2->second << " in one input and "
                                   << shape[d] << " in input '" << name << "'" << defaultNote(name, d);
          }
        }
        if (ShapedType::isDynamic(shape[d]))
          return f.emitError() << "input '" << name << "' dim " << d
                               << (param.empty() ? std::string("") : " ('" + param.str() + "')")
                               << " is dynamic; give --shapes " << name << "=... or --dim NAME=N";
      }
      // Inference plans may carry empty tensors (ONNX's own tests do), but a
      // training step over zero rows or zero positions has nothing to learn from.
      if (entry != sd::abi::kInfer)
        for (size_t d = 0; d < shape.size(); ++d)
          if (shape[d] == 0)
            return f.emitError() << "input '" << name << "' dim " << d << " is 0 in a training bucket; give "
                                 << use.shapesFlag << " a nonzero size";
      auto st = RankedTensorType::get(shape, argType.getElementType());
      body.getArgument(i).setType(st);
      argTypes.push_back(st);
    }
    clone.setType(builder.getFunctionType(argTypes, clone.getResultTypes()));
    SmallVector<NamedAttribute> named;
    for (auto &[k, v] : bucket) named.push_back(builder.getNamedAttr(k, builder.getI64IntegerAttr(v)));
    DictionaryAttr dict = builder.getDictionaryAttr(named);
    clone->setAttr("sd.bucket", dict);
    clone->setAttr("sd.entry", builder.getStringAttr(entry));
    // An If select whose condition these shapes decide drops a branch that may
    // not fit them: fold it now, before the verifier sees that branch.
    bool selects = false;
    clone.walk([&](sd::ir::IfSelectOp) { selects = true; });
    if (selects) return sd::propagateShapes(clone, sd::kImportFoldBytes);
    return success();
  }
};

} // namespace
