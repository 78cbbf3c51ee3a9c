// sd-lora-slots: sdc compile --max-loras N, a plan that serves several LoRA
// adapters in one batch (S-LoRA's and Punica's multi-adapter batching, vLLM's
// --max-loras). Each adapter factor global sd-peft-lora made, A [r, in] and
// B [out, r], becomes a stack of slots, m.lora_A.slots [N + 1, in, r] and
// m.lora_B.slots [N + 1, r, out] (transposed, so no step transposes), and
// every entry that reads them takes a lora_ids input, int64 [batch]: each
// row's slot. Each adapter product x Aᵀ (a linear of layout "oi") becomes
//   MatMul(x [batch, rows, in], Gather(slots, lora_ids) [batch, in, r])
// so each row goes through its own adapter. Slot 0 is the plan's own adapter
// (sdrun --adapter) and starts as zeros (the base model); sdrun writes the
// others. The scale alpha / r stays the plan's: sdrun folds an adapter's own
// scale over it into its B, and pads a lower rank with zeros, so adapters of
// any rank up to r and any alpha share the stacks. Runs on the specialized
// entries (after sd-kv-cache), before the passes that fuse linears.
#include "sd/format/training_abi.h"
#include "EntryInputs.h"
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "llvm/ADT/StringSet.h"

namespace sd {
#define GEN_PASS_DEF_LORASLOTS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct LoraSlotsPass : sd::impl::LoraSlotsBase<LoraSlotsPass> {
  using LoraSlotsBase::LoraSlotsBase;

  void runOnOperation() override {
    if (maxLoras <= 0) return;
    ModuleOp module = getOperation();
    auto peft = module->getAttrOfType<DictionaryAttr>("sd.peft");
    auto modules = peft ? peft.getAs<ArrayAttr>("modules") : ArrayAttr();
    if (!peft || !modules || peft.getAs<StringAttr>("peft_type").getValue() != "LORA") {
      module.emitError("--max-loras needs LoRA adapters (sd-peft-lora)");
      return signalPassFailure();
    }
    // Each factor global by name -> its stack, made from the first's shape.
    llvm::StringMap<GlobalOp> stacks;
    SymbolTable symbols(module);
    for (Attribute a : modules) {
      std::string m = cast<StringAttr>(a).str();
      for (const char *part : {".lora_A", ".lora_B"}) {
        auto g = symbols.lookup<GlobalOp>(m + part + ".weight");
        if (!g) {
          module.emitError() << "--max-loras: the plan has no global '" << m << part << ".weight'";
          return signalPassFailure();
        }
        ArrayRef<int64_t> d = cast<RankedTensorType>(g.getType()).getShape();
        stacks[g.getSymName()] = sd::createFloatGlobal(module, m + part + ".slots", {maxLoras + 1, d[1], d[0]},
                                                       "trainable", nullptr);
      }
    }
    for (auto f : llvm::to_vector(module.getOps<func::FuncOp>()))
      if (f->hasAttr("sd.entry") && failed(rewrite(f, stacks))) return signalPassFailure();
    llvm::StringSet<> stillRead; // factors read other than by the adapter products rewritten
    module.walk([&](GlobalLoadOp l) {
      if (stacks.count(l.getGlobal())) stillRead.insert(l.getGlobal());
    });
    for (auto &entry : stacks) {
      if (stillRead.count(entry.getKey())) {
        module.emitError() << "--max-loras: '" << entry.getKey() << "' is read other than by an adapter product";
        return signalPassFailure();
      }
      symbols.lookup<GlobalOp>(entry.getKey()).erase();
    }
    Builder b(module.getContext());
    NamedAttrList fields(peft);
    fields.set("max_loras", b.getI64IntegerAttr(maxLoras));
    module->setAttr("sd.peft", fields.getDictionary(module.getContext()));
  }

  // f's adapter products read the stacks at each row's slot (a lora_ids input
  // added when f has any).
  LogicalResult rewrite(func::FuncOp f, const llvm::StringMap<GlobalOp> &stacks) {
    SmallVector<LinearOp> products;
    f.walk([&](LinearOp l) {
      auto load = l.getWeight().getDefiningOp<GlobalLoadOp>();
      if (load && stacks.count(load.getGlobal())) products.push_back(l);
    });
    if (products.empty()) return success();
    int64_t batch = 0;
    for (BlockArgument arg : f.getArguments())
      if (sd::isTokenShaped(arg)) batch = cast<RankedTensorType>(arg.getType()).getDimSize(0);
    if (batch <= 0) return f.emitError("--max-loras: the entry has no int64 [batch, seq] token input");
    OpBuilder b(f.getContext());
    NamedAttribute name(b.getStringAttr("sd.name"), b.getStringAttr(sd::abi::kLoraIds));
    unsigned at = f.getNumArguments();
    f.insertArgument(at, RankedTensorType::get({batch}, b.getI64Type()), b.getDictionaryAttr({name}), f.getLoc());
    Value ids = f.getArgument(at);
    for (LinearOp l : products) {
      auto load = l.getWeight().getDefiningOp<GlobalLoadOp>();
      GlobalOp stack = stacks.lookup(load.getGlobal());
      auto xt = cast<RankedTensorType>(l.getInput().getType());
      auto yt = cast<RankedTensorType>(l.getOutput().getType());
      int64_t in = xt.getShape().back(), rows = xt.getNumElements() / in;
      if (l.getLayout() != "oi" || !isa<NoneType>(l.getBias().getType()) || xt.getDimSize(0) % batch != 0)
        return l.emitError() << "--max-loras: adapter product '" << l.getModule()
                             << "' is not a bias-free [batch, ..., in] product (layout oi)";
      b.setInsertionPoint(l);
      sd::ir::GradBuilder g(b, l.getLoc());
      Value slots = b.create<GlobalLoadOp>(l.getLoc(), stack.getType(), stack.getSymName());
      Value picked = g.make<GatherOp>({slots, ids}, {b.getNamedAttr("axis", b.getI64IntegerAttr(0))});
      Value x = g.reshape(l.getInput(), {batch, rows / batch, in});
      Value y = g.reshape(g.make<MatMulOp>({x, picked}), yt.getShape());
      if (!y || g.failed()) return l.emitError("--max-loras: cannot build the per-row adapter product");
      l.getOutput().replaceAllUsesWith(y);
      l.erase();
      if (load->use_empty()) load.erase();
    }
    return success();
  }
};

} // namespace
