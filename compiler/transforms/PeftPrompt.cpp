// sd-peft-prompt: prompt tuning (PEFT's PromptTuningConfig): trained
// embeddings of N virtual tokens put before every row's own, everything
// else frozen; with `prefix`, prefix tuning (PrefixTuningConfig): N virtual
// tokens whose keys and values in every layer are trained (they are made
// by sd-prefix-attention, once the attention's shapes are known).
//
// The model is not rebuilt for a longer sequence. Virtual token i is the id
// vocab + i: the token input gets those N ids in front, so everything an
// export derives from the tokens (positions, the causal mask, shapes) sees
// N + S positions, and the embedding lookup takes ids from vocab on from the
// prompt. PEFT does the same with inputs_embeds: the base model runs on
// N + S positions, with positions 0..N+S-1 and the attention mask extended by
// ones. The lookup does not depend on where a virtual id stands, so the
// generation entries (sd-kv-entries) take the virtual ids as ordinary tokens
// through the key/value cache: there each op marked sd.virtual_prefix (the
// lengthening Concats; prefix tuning's logits Slice) stands for the operand
// it names, and the generator feeds the ids first.
#include "EntryInputs.h"
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "sd/format/dtype.h"
#include "sd/format/peft.h"
#include "sd/format/training_abi.h"
#include "vjp/GradBuilder.h"
#include <limits>
#include <random>

namespace sd {
#define GEN_PASS_DEF_PEFTPROMPT
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct PeftPromptPass : sd::impl::PeftPromptBase<PeftPromptPass> {
  using PeftPromptBase::PeftPromptBase;

  struct TableOf {
    GlobalOp global; // null when the table is not a global the compiler may read
    int64_t vocab, hidden;
  };

  const char *who() const { return prefix ? "--peft prefix" : "--peft prompt"; }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    const char *kWho = who();
    if (prefix && init != "random") {
      module.emitError() << "--prompt-init is for --peft prompt (prefix tuning starts from N(0, 1))";
      return signalPassFailure();
    }
    if (virtualTokens < 1 || virtualTokens > 65536) {
      module.emitError() << "--num-virtual-tokens must be from 1 to 65536, got " << int64_t(virtualTokens);
      return signalPassFailure();
    }
    if (init != "random" && init != "vocab" && init != "text") {
      module.emitError() << "--prompt-init takes 'random', 'vocab' or 'text', got '" << init << "'";
      return signalPassFailure();
    }
    if ((init == "text") != !initIds.empty()) {
      module.emitError() << "--prompt-init text needs the start text's token ids, and only it takes them";
      return signalPassFailure();
    }
    func::FuncOp infer = sd::findEntry(module, sd::abi::kInfer);
    if (!infer) {
      module.emitError("the model has no infer entry to put a prompt before");
      return signalPassFailure();
    }
    FailureOr<unsigned> token = sd::findTokenInput(infer, tokenInput, kWho);
    if (failed(token)) return signalPassFailure();
    // The rows run on N + S positions: an export that fixed S cannot.
    if (int64_t seq = cast<RankedTensorType>(infer.getArgument(*token).getType()).getDimSize(1);
        !ShapedType::isDynamic(seq)) {
      infer.emitError() << kWho << ": the model fixes input '" << sd::argName(infer, *token) << "' at " << seq
                        << " tokens per row, but the virtual tokens make every row " << int64_t(virtualTokens)
                        << " longer; export it with a dynamic sequence axis (torch.onnx.export's dynamic_shapes or "
                           "dynamic_axes)";
      return signalPassFailure();
    }
    // Frozen first: the table's values are read only from a frozen weight.
    for (GlobalOp g : module.getOps<GlobalOp>())
      if (g.getRole() == "trainable") g.setRole("frozen");
    Operation *lookup = sd::embeddingLookupOf(infer.getArgument(*token));
    FailureOr<TableOf> table = lookup ? embeddingTable(lookup) : FailureOr<TableOf>(failure());
    if (!lookup || failed(table)) {
      infer.emitError() << kWho << ": the token input '" << sd::argName(infer, *token)
                        << "' must index an f32 [vocab, hidden] embedding table straight into [batch, seq, hidden]";
      return signalPassFailure();
    }
    if (init != "random" &&
        (!table->global || sd::floatsOf(table->global).size() != size_t(table->vocab * table->hidden))) {
      infer.emitError() << kWho << ": --prompt-init " << init << " needs the embedding table's values in the model";
      return signalPassFailure();
    }
    for (int64_t id : initIds)
      if (id < 0 || id >= table->vocab) {
        infer.emitError() << kWho << ": --prompt-init-text gives token " << id << ", outside the model's "
                          << table->vocab << " embeddings (is --tokenizer the model's?)";
        return signalPassFailure();
      }
    Builder b(module.getContext());
    if (prefix) {
      // The keys and values come when the attention's shapes are known (sd-prefix-attention).
      if (failed(lengthenInputs(infer, *token, table->vocab)) || failed(markVirtualLookup(lookup, table->vocab)) ||
          failed(dropVirtualLogits(infer)))
        return signalPassFailure();
      module->setAttr("sd.peft", b.getDictionaryAttr({
                                     b.getNamedAttr("peft_type", b.getStringAttr("PREFIX_TUNING")),
                                     b.getNamedAttr("num_virtual_tokens", b.getI64IntegerAttr(virtualTokens)),
                                     b.getNamedAttr("first_virtual_id", b.getI64IntegerAttr(table->vocab)),
                                 }));
      return;
    }
    std::vector<float> values = initialPrompt(*table);
    GlobalOp prompt = sd::createFloatGlobal(module, sd::kPromptEmbeddings, {virtualTokens, table->hidden},
                                            "trainable", &values);
    if (failed(lengthenInputs(infer, *token, table->vocab)) || failed(lookUpVirtualIds(lookup, prompt, table->vocab)))
      return signalPassFailure();
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("PROMPT_TUNING")),
                                   b.getNamedAttr("num_virtual_tokens", b.getI64IntegerAttr(virtualTokens)),
                                   b.getNamedAttr("token_dim", b.getI64IntegerAttr(table->hidden)),
                                   b.getNamedAttr("first_virtual_id", b.getI64IntegerAttr(table->vocab)),
                                   b.getNamedAttr("prompt_tuning_init",
                                                  b.getStringAttr(init == "vocab"  ? "SAMPLE_VOCAB"
                                                                  : init == "text" ? "TEXT"
                                                                                   : "RANDOM")),
                                   b.getNamedAttr("prompt_tuning_init_text", b.getStringAttr(initText)),
                                   b.getNamedAttr("tokenizer_name_or_path", b.getStringAttr(tokenizerPath)),
                               }));
  }

  // The lookup's table: f32 [vocab, hidden] gathered on axis 0 into [batch, seq, hidden].
  FailureOr<TableOf> embeddingTable(Operation *lookup) {
    auto gather = cast<GatherOp>(lookup);
    auto t = dyn_cast<RankedTensorType>(gather.getOperand(0).getType());
    auto out = dyn_cast<RankedTensorType>(gather.getResult().getType());
    auto axis = gather->getAttrOfType<IntegerAttr>("axis");
    if (!t || t.getRank() != 2 || !t.hasStaticShape() || !t.getElementType().isF32() || !out || out.getRank() != 3 ||
        (axis && axis.getInt() != 0))
      return failure();
    return TableOf{sd::frozenGlobalOf(gather.getOperand(0)), t.getDimSize(0), t.getDimSize(1)};
  }

  // PEFT's RANDOM (nn.Embedding's N(0, 1)) or SAMPLE_VOCAB (the table's rows
  // of uniformly drawn token ids), from --seed, or TEXT (the rows of the
  // text's tokens, repeated, then cut to the virtual tokens, as PEFT does).
  std::vector<float> initialPrompt(const TableOf &table) {
    std::mt19937_64 rng{uint64_t(seed)};
    std::vector<float> values(size_t(virtualTokens * table.hidden));
    if (init == "text") { // the ids were checked before
      llvm::ArrayRef<float> rows = sd::floatsOf(table.global);
      for (int64_t i = 0; i < virtualTokens; ++i) {
        int64_t id = initIds[size_t(i) % initIds.size()];
        std::copy_n(rows.begin() + id * table.hidden, table.hidden, values.begin() + i * table.hidden);
      }
      return values;
    }
    if (init == "vocab") { // the table's values were checked before
      llvm::ArrayRef<float> rows = sd::floatsOf(table.global);
      std::uniform_int_distribution<int64_t> token(0, table.vocab - 1);
      for (int64_t i = 0; i < virtualTokens; ++i) {
        int64_t id = token(rng);
        std::copy_n(rows.begin() + id * table.hidden, table.hidden, values.begin() + i * table.hidden);
      }
      return values;
    }
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float &v : values) v = normal(rng);
    return values;
  }

  // Concat([batch, N] of `fill`, v [batch, seq]) on axis 1, marked
  // sd.virtual_prefix = 1 (entries that feed the virtual ids as tokens use `v`).
  // `fill` is a value per position [N] (virtual ids), else `value` everywhere.
  Value prepend(GradBuilder &g, Value v, Value rowsOf, double value, ArrayRef<int64_t> fill = {}) {
    OpBuilder &b = g.builder();
    auto type = cast<RankedTensorType>(v.getType());
    Value rows = g.make<ShapeOp>({rowsOf}, {g.attr("start", 0), g.attr("end", 1)});
    Value shape = g.make<ConcatOp>({rows, g.ints({virtualTokens})}, {g.attr("axis", 0)});
    Value front = fill.empty()
                      ? g.make<ConstantOfShapeOp>({shape}, {b.getNamedAttr("value", b.getF64FloatAttr(value)),
                                                            g.attr("dtype", int64_t(*toDType(type.getElementType())))})
                      : g.make<ExpandOp>({g.ints({1, int64_t(fill.size())}, fill), shape});
    Value joined = g.make<ConcatOp>({front, v}, {g.attr("axis", 1)});
    if (joined) joined.getDefiningOp()->setAttr(sd::kVirtualPrefixAttr, b.getI64IntegerAttr(1));
    return joined;
  }

  // The token input and the inputs aligned with it take N positions more:
  // the virtual ids vocab..vocab+N-1, attention_mask ones and token_type_ids
  // zeros (PEFT's own extension); position_ids become 0..N+S-1, as PEFT
  // ignores given ones (transformers then counts positions itself).
  LogicalResult lengthenInputs(func::FuncOp f, unsigned tokenArg, int64_t vocab) {
    Value tokens = f.getArgument(tokenArg);
    OpBuilder b = OpBuilder::atBlockBegin(&f.getBody().front());
    GradBuilder g(b, NameLoc::get(b.getStringAttr("virtual_tokens")));
    llvm::SmallVector<OpOperand *> tokenUses = sd::usesOf(tokens);
    SmallVector<int64_t> ids;
    for (int64_t i = 0; i < virtualTokens; ++i) ids.push_back(vocab + i);
    Value longer = prepend(g, tokens, tokens, 0.0, ids);
    if (g.failed()) return failure();
    for (OpOperand *u : tokenUses) u->set(longer);
    llvm::BitVector drop(f.getNumArguments());
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      if (i == tokenArg) continue;
      Value arg = f.getArgument(i);
      std::string name = sd::argName(f, i);
      auto type = dyn_cast<RankedTensorType>(arg.getType());
      bool aligned = type && type.getRank() == 2 && toDType(type.getElementType());
      if (name == sd::abi::kPositionIds && sd::isTokenShaped(arg)) {
        Value seq = g.reshape(g.make<ShapeOp>({longer}, {g.attr("start", 1), g.attr("end", 2)}), {});
        Value range = g.make<RangeOp>({g.reshape(g.ints({0}), {}), seq, g.reshape(g.ints({1}), {})});
        // [1, N + S], as transformers' own default (cache_position.unsqueeze(0)):
        // rotary tables then fold to one row for any batch.
        Value positions = g.make<UnsqueezeOp>({range, g.ints({0})});
        if (g.failed()) return failure();
        arg.replaceAllUsesWith(positions);
        drop.set(i);
      } else if ((name == sd::abi::kAttentionMask || name == "token_type_ids") && aligned) {
        llvm::SmallVector<OpOperand *> uses = sd::usesOf(arg);
        Value extended = prepend(g, arg, tokens, name == sd::abi::kAttentionMask ? 1.0 : 0.0);
        if (g.failed()) return failure();
        for (OpOperand *u : uses) u->set(extended);
      }
    }
    f.eraseArguments(drop);
    return success();
  }

  // The ids clamped into the table (a virtual id reads its last row).
  static Value tableIds(GradBuilder &g, Value ids, int64_t vocab) {
    return g.make<MinOp>({ids, g.scalar(cast<RankedTensorType>(ids.getType()).getElementType(), double(vocab - 1))});
  }

  // Prompt tuning: rows of ids below vocab from the table, of the virtual ids from the
  // prompt: where(id >= vocab, prompt[max(id - vocab, 0)], table[min(id, vocab - 1)]).
  LogicalResult lookUpVirtualIds(Operation *lookup, GlobalOp prompt, int64_t vocab) {
    auto gather = cast<GatherOp>(lookup);
    Value table = gather.getOperand(0), ids = gather.getOperand(1);
    OpBuilder b(lookup);
    GradBuilder g(b, NameLoc::get(b.getStringAttr("prompt_embeddings")));
    sd::VirtualIds virtualIds = sd::virtualIdsAmong(g, ids, vocab);
    Value own = g.make<GatherOp>({table, tableIds(g, ids, vocab)}, {g.attr("axis", 0)});
    Value p = b.create<GlobalLoadOp>(g.loc(), prompt.getType(), prompt.getSymName());
    Value virtualRows = g.make<GatherOp>({p, virtualIds.slot}, {g.attr("axis", 0)});
    Value rows = g.make<WhereOp>({g.make<UnsqueezeOp>({virtualIds.isVirtual, g.ints({-1})}), virtualRows, own});
    if (g.failed()) return failure();
    lookup->getResult(0).replaceAllUsesWith(rows);
    lookup->erase();
    return success();
  }

  // Prefix tuning: a virtual id's embedding is any row (the table's last):
  // its keys and values are replaced in every layer, so nothing it computes
  // reaches a real token. The lookup is marked for sd-prefix-attention,
  // which reads the ids there.
  LogicalResult markVirtualLookup(Operation *lookup, int64_t vocab) {
    OpBuilder b(lookup);
    GradBuilder g(b, NameLoc::get(b.getStringAttr("virtual_tokens")));
    Value own = tableIds(g, lookup->getOperand(1), vocab);
    if (g.failed()) return failure();
    lookup->setOperand(1, own);
    lookup->setAttr(sd::kVirtualLookupAttr, b.getUnitAttr());
    return success();
  }

  // Prefix tuning's logits are the tokens' own, as PEFT's: the virtual
  // positions' are sliced off (marked: entries that feed the ids as tokens
  // keep every position's).
  LogicalResult dropVirtualLogits(func::FuncOp f) {
    FailureOr<unsigned> index = sd::findLogitsOutput(f, "", who());
    if (failed(index)) return failure();
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    OpBuilder b(ret);
    GradBuilder g(b, NameLoc::get(b.getStringAttr("virtual_tokens")));
    Value own = g.sliceAxis(ret.getOperand(*index), 1, virtualTokens, std::numeric_limits<int64_t>::max());
    if (g.failed()) return failure();
    own.getDefiningOp()->setAttr(sd::kVirtualPrefixAttr, b.getI64IntegerAttr(0));
    ret.setOperand(*index, own);
    return success();
  }
};

} // namespace
