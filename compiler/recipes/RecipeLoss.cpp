// Shared pieces of the training recipes' loss entries.
#include "RecipeLoss.h"
#include "AdaloraAllocation.h"
#include "EntryInputs.h"
#include "sd/format/dtype.h"
#include "sd/format/training_abi.h"
#include "PassDetail.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/IRMapping.h"
#include <limits>

using namespace mlir;
using namespace sd::ir;

namespace sd {

int64_t promptVirtualTokens(ModuleOp module) {
  auto peft = module->getAttrOfType<DictionaryAttr>("sd.peft");
  auto type = peft ? peft.getAs<StringAttr>("peft_type") : StringAttr();
  auto n = peft ? peft.getAs<IntegerAttr>("num_virtual_tokens") : IntegerAttr();
  // Prefix tuning's logits are the tokens' own already.
  return n && type && type.getValue() == "PROMPT_TUNING" ? n.getInt() : 0;
}

Value countedLabels(GradBuilder &g, Value labels) {
  Value ignored = g.make<EqualOp>({labels, g.scalar(g.builder().getI64Type(), double(kIgnoreIndex))});
  return g.make<CastOp>({g.make<NotOp>({ignored})}, {g.attr("to", int64_t(sd::DType::F32))});
}

SummedLoss summedCrossEntropy(GradBuilder &g, Value scores, Value labels) {
  OpBuilder &b = g.builder();
  Value loss = g.make<SoftmaxCrossEntropyLossOp>(
      {scores, labels, g.none()},
      {b.getNamedAttr("reduction", b.getStringAttr("sum")), g.attr("ignore_index", kIgnoreIndex)});
  Value count = g.make<ReduceSumOp>({countedLabels(g, labels), g.none()}, {g.attr("keepdims", 0)});
  if (g.failed()) return {};
  if (cast<RankedTensorType>(loss.getType()).getElementType() != b.getF32Type())
    loss = g.make<CastOp>({loss}, {g.attr("to", int64_t(sd::DType::F32))});
  return {loss, count};
}

// AdaLoRA (PEFT's AdaLoraModel.forward): the loss gains orth_reg_weight
// times the mean over every lora_A and lora_B of |A Aᵀ - I|_F (|Bᵀ B - I|_F).
// The entry returns a sum over `count` labels, so the penalty enters times
// count: per label it is PEFT's.
static Value orthogonalityPenalty(func::FuncOp f, Value loss, Value count) {
  auto module = f->getParentOfType<ModuleOp>();
  if (!trainsAdalora(module)) return loss;
  auto peft = module->getAttrOfType<DictionaryAttr>("sd.peft");
  auto weight = peft.getAs<FloatAttr>("orth_reg_weight");
  auto modules = peft.getAs<ArrayAttr>("modules");
  if (!weight || weight.getValueAsDouble() <= 0 || !modules || modules.empty()) return loss;
  OpBuilder b(f.getBody().front().getTerminator());
  Location loc = NameLoc::get(b.getStringAttr("adalora_orth_reg"));
  GradBuilder g(b, loc);
  Type f32 = b.getF32Type();
  Value total;
  for (Attribute m : modules) {
    for (const char *factor : {".lora_A", ".lora_B"}) {
      std::string name = cast<StringAttr>(m).getValue().str() + factor;
      auto global = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, name));
      if (!global) return Value();
      Value p = b.create<GlobalLoadOp>(loc, global.getType(), global.getSymName());
      bool isA = factor[6] == 'A';
      Value cov = isA ? g.make<MatMulOp>({p, g.transpose(p, {1, 0})}) : g.make<MatMulOp>({g.transpose(p, {1, 0}), p});
      int64_t n = cast<RankedTensorType>(global.getType()).getDimSize(isA ? 0 : 1);
      std::vector<float> eye(size_t(n * n), 0.0f);
      for (int64_t i = 0; i < n; ++i) eye[size_t(i * n + i)] = 1.0f;
      auto eyeType = RankedTensorType::get({n, n}, f32);
      Value identity = b.create<ConstantOp>(loc, eyeType, DenseElementsAttr::get(eyeType, ArrayRef<float>(eye)));
      Value d = g.sub(cov, identity);
      Value norm = g.make<SqrtOp>({g.reduceSum(g.mul(d, d), {0, 1}, false)});
      total = total ? g.add(total, norm) : norm;
    }
  }
  Value penalty = g.scale(total, weight.getValueAsDouble() / double(2 * modules.size()));
  Value summed = g.add(loss, g.mul(penalty, count));
  return g.failed() ? Value() : summed;
}

LogicalResult finishLossEntry(func::FuncOp f, Value loss, Value count) {
  loss = orthogonalityPenalty(f, loss, count);
  if (!loss) return f.emitError("AdaLoRA's orthogonality penalty: an adapter factor is missing");
  setEntryOutputs(f, {loss, count}, {sd::abi::kLossSum, sd::abi::kTokens});
  return success();
}

Value addLabelsInput(func::FuncOp f, unsigned like, int64_t rank, llvm::StringRef name, Type element) {
  MLIRContext *ctx = f.getContext();
  auto likeType = cast<RankedTensorType>(f.getArgument(like).getType());
  auto type = RankedTensorType::get(likeType.getShape().take_front(size_t(rank)),
                                    element ? element : IntegerType::get(ctx, 64));
  SmallVector<NamedAttribute> attrs = {NamedAttribute(StringAttr::get(ctx, "sd.name"), StringAttr::get(ctx, name))};
  if (auto params = f.getArgAttrOfType<ArrayAttr>(like, "sd.dim_params"))
    attrs.push_back(NamedAttribute(StringAttr::get(ctx, "sd.dim_params"),
                                   ArrayAttr::get(ctx, params.getValue().take_front(size_t(rank)))));
  unsigned index = f.getNumArguments();
  f.insertArgument(index, type, DictionaryAttr::get(ctx, attrs), f.getLoc());
  return f.getArgument(index);
}

Value tokenLogProbs(GradBuilder &g, Value logits, Value next, Value rowsLike) {
  OpBuilder &b = g.builder();
  int64_t vocab = cast<RankedTensorType>(logits.getType()).getDimSize(2);
  Value nll = g.make<SoftmaxCrossEntropyLossOp>(
      {g.reshape(logits, {-1, vocab}), next, g.none()},
      {b.getNamedAttr("reduction", b.getStringAttr("none")), g.attr("ignore_index", kIgnoreIndex)});
  return g.neg(g.make<ReshapeOp>({nll, g.make<ShapeOp>({rowsLike})}));
}

FailureOr<Value> referenceForward(func::FuncOp f, Value v, llvm::StringRef who) {
  auto module = f->getParentOfType<ModuleOp>();
  Block &body = f.getBody().front();
  OpBuilder b(body.getTerminator());
  DenseSet<Value> varied;
  IRMapping copy;
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator()) ops.push_back(&op);
  for (Operation *op : ops) {
    if (isa<GlobalStoreOp, LoopOp, IfOp>(op))
      return op->emitError() << who << ": " << describeNode(op)
                             << (isa<GlobalStoreOp>(op) ? " updates state in the forward" : " runs a body entry")
                             << ", which the reference model's copy of the forward cannot repeat";
    GlobalOp trainable;
    if (auto load = dyn_cast<GlobalLoadOp>(op)) {
      auto g = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, load.getGlobal()));
      if (g && g.getRole() == "trainable") trainable = g;
    }
    if (!trainable && llvm::none_of(op->getOperands(), [&](Value o) { return varied.contains(o); })) continue;
    Operation *c = b.clone(*op, copy);
    for (Value r : op->getResults()) varied.insert(r);
    if (!trainable) continue;
    GlobalOp ref = getOrCreateGlobal(module, std::string(abi::kReferencePrefix) + trainable.getSymName().str(),
                                     trainable.getType(), "scalar_state", trainable.getInitialValueAttr());
    cast<GlobalLoadOp>(c).setGlobal(ref.getSymName());
    c->removeAttr(kDetachedAttr); // no gradient reaches a reference copy anyway
  }
  if (!varied.contains(v)) return f.emitError() << who << ": the logits do not depend on any trainable parameter";
  return copy.lookup(v);
}

func::FuncOp cloneInferAsEvalStep(ModuleOp module, llvm::StringRef tokenInput, llvm::StringRef who, bool bindInputs) {
  func::FuncOp infer = findEntry(module, abi::kInfer);
  if (!infer) {
    module.emitError("the model has no infer entry to build a training recipe on");
    return {};
  }
  // The data gives tokens only: a Hugging Face export's attention_mask,
  // position_ids and past_key_values take what a step over whole rows
  // means, in the training entries and in the infer entry sdrun generate
  // and infer --adapter use with them.
  FailureOr<unsigned> token = bindInputs ? findTokenInput(infer, tokenInput, who) : FailureOr<unsigned>(0u);
  if (failed(token) ||
      (bindInputs && failed(bindAuxiliaryInputs(infer, *token, /*keepPositions=*/false, who, /*refuseOthers=*/false))))
    return {};
  OpBuilder b(infer);
  auto eval = cast<func::FuncOp>(b.clone(*infer));
  eval.setName(abi::kEvalStep);
  eval->setAttr("sd.entry", b.getStringAttr(abi::kEvalStep));
  return eval;
}

Value nextTokenLabels(GradBuilder &g, Value labels) {
  // Position t predicts token t+1: labels shift left, the last position is ignored.
  Value shifted = g.make<SliceOp>({labels, g.ints({1}), g.ints({std::numeric_limits<int64_t>::max()}), g.ints({1}),
                                   g.none()});
  Value ignore = g.scalar(g.builder().getI64Type(), double(kIgnoreIndex));
  return g.reshape(g.make<PadOp>({shifted, g.ints({0, 0, 0, 1}), ignore, g.none()}), {-1});
}

FailureOr<TokenScores> tokenScores(func::FuncOp f, llvm::StringRef logitsOutput, llvm::StringRef tokenInput,
                                   llvm::StringRef who) {
  auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
  FailureOr<unsigned> logitsIndex = findLogitsOutput(f, logitsOutput, who);
  if (failed(logitsIndex)) return failure();
  Value logits = ret.getOperand(*logitsIndex);
  auto lt = cast<RankedTensorType>(logits.getType());
  if (lt.getRank() != 3 || ShapedType::isDynamic(lt.getDimSize(2)))
    return f.emitError() << "logits must be [batch, seq, vocab] with a static vocabulary, got " << lt;
  FailureOr<unsigned> found = findTokenInput(f, tokenInput, who);
  if (failed(found)) return failure();
  unsigned tokenArg = *found;
  auto tokenType = cast<RankedTensorType>(f.getArgument(tokenArg).getType());
  // sdrun train feeds the data's token ids to this input, whatever it is called.
  f->getParentOfType<ModuleOp>()->setAttr("sd.token_input", StringAttr::get(f.getContext(), argName(f, tokenArg)));
  Value labels = addLabelsInput(f, tokenArg, tokenType.getRank(), abi::kLabels);

  OpBuilder b(ret);
  GradBuilder g(b, NameLoc::get(b.getStringAttr("next_token_labels")));
  // Prompt tuning's logits cover its virtual tokens too: labels there are
  // not counted, so the last virtual token's scores meet the first token (PEFT's).
  Value scored = labels;
  if (int64_t n = promptVirtualTokens(f->getParentOfType<ModuleOp>()))
    scored = g.make<PadOp>({labels, g.ints({0, n, 0, 0}), g.scalar(b.getI64Type(), double(kIgnoreIndex)), g.none()});
  Value flat = nextTokenLabels(g, scored);
  if (g.failed()) return failure();
  return TokenScores{logits, f.getArgument(tokenArg), labels, flat};
}

} // namespace sd
