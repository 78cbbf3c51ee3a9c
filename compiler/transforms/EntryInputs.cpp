// Entry input/output naming and the token input, shared by the entry builders.
#include "EntryInputs.h"
#include "OpLibraryBridge.h"
#include "SDDialect.h"
#include "sd/format/training_abi.h"
#include "vjp/GradBuilder.h"
#include "llvm/ADT/BitVector.h"

using namespace mlir;
using namespace sd::ir;

func::FuncOp sd::findEntry(ModuleOp module, StringRef entry) {
  for (auto f : module.getOps<func::FuncOp>())
    if (auto e = f->getAttrOfType<StringAttr>("sd.entry"); e && e.getValue() == entry) return f;
  return {};
}

std::string sd::outputName(func::FuncOp f, unsigned i) {
  auto names = f->getAttrOfType<ArrayAttr>("sd.output_names");
  return names && i < names.size() ? cast<StringAttr>(names[i]).str() : "output" + std::to_string(i);
}

std::string sd::outputNamesNote(func::FuncOp f) {
  std::string names;
  for (unsigned i = 0; i < f.getBody().front().getTerminator()->getNumOperands(); ++i)
    names += (names.empty() ? "'" : ", '") + outputName(f, i) + "'";
  return " (the model's outputs: " + names + ")";
}

void sd::setEntryOutputs(func::FuncOp f, ValueRange values, ArrayRef<StringRef> names) {
  auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
  OpBuilder b(ret);
  b.create<func::ReturnOp>(ret.getLoc(), values);
  ret.erase();
  f.setType(FunctionType::get(f.getContext(), f.getArgumentTypes(), values.getTypes()));
  f->setAttr("sd.output_names", b.getStrArrayAttr(names));
}

std::string sd::argName(func::FuncOp f, unsigned i) {
  auto name = f.getArgAttrOfType<StringAttr>(i, "sd.name");
  return name ? name.str() : "input" + std::to_string(i);
}

FailureOr<unsigned> sd::findLogitsOutput(func::FuncOp f, StringRef named, StringRef who) {
  Operation *ret = f.getBody().front().getTerminator();
  int found = -1;
  for (unsigned i = 0; i < ret->getNumOperands(); ++i) {
    auto t = dyn_cast<RankedTensorType>(ret->getOperand(i).getType());
    bool isLogits = t && t.getRank() == 3 && isa<FloatType>(t.getElementType());
    if (!named.empty() ? outputName(f, i) == named : isLogits) {
      if (found >= 0)
        return f.emitError() << who << ": the model has several [batch, seq, vocab] float outputs; name the logits "
                                       "with --logits-output";
      found = int(i);
    }
  }
  if (found < 0)
    return f.emitError() << who << ": "
                         << (named.empty() ? std::string("the model has no [batch, seq, vocab] logits output")
                                           : "--logits-output '" + named.str() + "' is not an output" +
                                                 outputNamesNote(f));
  return unsigned(found);
}

bool sd::isTokenShaped(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getRank() == 2 && t.getElementType().isInteger(64);
}

// Indexes an embedding table: the indices of a Gather, directly or through
// a cast or reshape (nanoGPT-style and Hugging Face exports both do this).
Operation *sd::embeddingLookupOf(Value v, int depth) {
  for (OpOperand &use : v.getUses()) {
    Operation *user = use.getOwner();
    if (isa<GatherOp>(user) && use.getOperandNumber() == 1) return user;
    if (depth < 3 && isa<CastOp, ReshapeOp, FlattenOp, SqueezeOp, UnsqueezeOp>(user) && user->getNumResults() == 1)
      if (Operation *gather = embeddingLookupOf(user->getResult(0), depth + 1)) return gather;
  }
  return nullptr;
}

FailureOr<unsigned> sd::findTokenInput(func::FuncOp f, StringRef named, StringRef who) {
  SmallVector<unsigned> candidates, embedding;
  std::string names;
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    if (!named.empty()) {
      if (argName(f, i) != named) continue;
      if (!isTokenShaped(f.getArgument(i)))
        return f.emitError() << "--token-input '" << named << "' must be an int64 [batch, seq] input, it is "
                             << f.getArgument(i).getType();
      return i;
    }
    if (!isTokenShaped(f.getArgument(i))) continue;
    // Hugging Face's other int64 [batch, seq] inputs (GPT-2's position_ids
    // index an embedding too).
    std::string name = argName(f, i);
    if (name == "attention_mask" || name == "position_ids" || name == "token_type_ids") continue;
    candidates.push_back(i);
    names += (names.empty() ? "'" : ", '") + argName(f, i) + "'";
    if (embeddingLookupOf(f.getArgument(i))) embedding.push_back(i);
  }
  if (!named.empty()) return f.emitError() << "--token-input '" << named << "' is not a model input";
  if (candidates.size() == 1) return candidates[0];
  if (embedding.size() == 1) return embedding[0];
  if (candidates.empty()) return f.emitError() << who << " needs an int64 [batch, seq] token input";
  return f.emitError() << "cannot tell the token input among the int64 [batch, seq] inputs " << names
                       << "; name it with --token-input NAME";
}

// past_key_values.N.key / .value (Optimum), past.N.key (older exports): [batch, kv_heads, past, d].
static bool isPastCache(StringRef name, RankedTensorType type) {
  return (name.starts_with("past_key_values.") || name.starts_with("past.")) && type && type.getRank() == 4 &&
         !ShapedType::isDynamic(type.getDimSize(1)) && isa<FloatType>(type.getElementType()) &&
         sd::ir::toDType(type.getElementType());
}

// A past cache's head size: its own dim 3, or (onnxruntime-genai names it
// kv_cache_dim) the dim 3 of the Reshape that reads it as [batch, heads, past, d].
static int64_t pastHeadSize(Value past) {
  int64_t d = cast<RankedTensorType>(past.getType()).getDimSize(3);
  if (!ShapedType::isDynamic(d)) return d;
  for (Operation *u : past.getUsers())
    if (auto r = dyn_cast<ReshapeOp>(u)) {
      auto t = dyn_cast<RankedTensorType>(r.getResult().getType());
      if (t && t.getRank() == 4 && !ShapedType::isDynamic(t.getDimSize(3))) return t.getDimSize(3);
    }
  return ShapedType::kDynamic;
}

LogicalResult sd::bindAuxiliaryInputs(func::FuncOp f, unsigned tokenArg, bool keepPositions, StringRef flag,
                                      bool refuseOthers, bool keepMask) {
  Value tokens = f.getArgument(tokenArg);
  llvm::BitVector drop(f.getNumArguments());
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    if (i == tokenArg) continue;
    std::string name = argName(f, i);
    Value arg = f.getArgument(i);
    auto type = dyn_cast<RankedTensorType>(arg.getType());
    OpBuilder b = OpBuilder::atBlockBegin(&f.getBody().front());
    sd::ir::GradBuilder g(b, NameLoc::get(b.getStringAttr("bound_" + name)));
    auto fill = [&](Value shape, double value) {
      return g.make<ConstantOfShapeOp>({shape}, {b.getNamedAttr("value", b.getF64FloatAttr(value)),
                                                 g.attr("dtype", int64_t(*sd::ir::toDType(type.getElementType())))});
    };
    Value bound;
    if (name == sd::abi::kPositionIds && isTokenShaped(arg)) {
      if (keepPositions) continue;
      // arange(seq) as [1, seq], as transformers' own default
      // (cache_position.unsqueeze(0)): rows share the positions, so rotary
      // tables fold to one row whatever the batch (sd-kv-cache reads them so).
      Value seq = g.reshape(g.make<ShapeOp>({tokens}, {g.attr("start", 1), g.attr("end", 2)}), {});
      Value range = g.make<RangeOp>({g.reshape(g.ints({0}), {}), seq, g.reshape(g.ints({1}), {})});
      bound = g.make<UnsqueezeOp>({range, g.ints({0})});
    } else if (isPastCache(name, type)) {
      int64_t head = pastHeadSize(arg);
      if (ShapedType::isDynamic(head))
        return f.emitError() << flag << ": the head size of the model's input '" << name
                             << "' is not known; give it with --dim NAME=SIZE";
      Value rows = g.make<ShapeOp>({tokens}, {g.attr("start", 0), g.attr("end", 1)});
      bound = fill(g.make<ConcatOp>({rows, g.ints({type.getDimSize(1), 0, head})}, {g.attr("axis", 0)}), 0.0);
    } else if (name == sd::abi::kAttentionMask && type && type.getRank() == 2 && sd::ir::toDType(type.getElementType())) {
      if (keepMask) continue;
      bound = fill(g.make<ShapeOp>({tokens}), 1.0);
    } else if (name == "token_type_ids" && type && type.getRank() == 2 && sd::ir::toDType(type.getElementType())) {
      bound = fill(g.make<ShapeOp>({tokens}), 0.0);
    } else if (refuseOthers) {
      return f.emitError() << flag << ": the model's input '" << name << "' (" << arg.getType()
                           << ") cannot be bound; export the model with only the token input (and optionally "
                              "attention_mask, position_ids, token_type_ids, past_key_values.N.key/value)";
    } else {
      continue;
    }
    if (g.failed() || !bound) return failure();
    arg.replaceAllUsesWith(bound);
    drop.set(i);
  }
  f.eraseArguments(drop);
  return success();
}
