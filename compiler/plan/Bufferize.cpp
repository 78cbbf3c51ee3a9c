// sd-bufferize: tensor entries -> buffer-level step IR (destination passing).
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "llvm/ADT/StringSet.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseSet.h"

namespace sd {
#define GEN_PASS_DEF_BUFFERIZE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

MemRefType toMemRef(Type t) {
  auto rt = cast<RankedTensorType>(t);
  return MemRefType::get(rt.getShape(), rt.getElementType());
}

// A Transpose that moves only axes of size 1 leaves every element where it
// was: a decode step's query [B, 1, H, d] as [B, H, 1, d], a multi-query
// model's one key/value head [B, S, 1, d] as [B, 1, S, d].
bool movesNoData(TransposeOp t) {
  auto in = dyn_cast<RankedTensorType>(t.getInput().getType());
  if (!in) return false;
  SmallVector<int64_t> perm;
  if (t.getPerm()) perm.assign(t.getPerm()->begin(), t.getPerm()->end());
  else
    for (int64_t a = in.getRank() - 1; a >= 0; --a) perm.push_back(a);
  int64_t last = -1;
  for (int64_t axis : perm) {
    if (in.getDimSize(axis) == 1) continue;
    if (axis < last) return false;
    last = axis;
  }
  return true;
}

// Ops that only reinterpret their first operand's bytes.
bool isAlias(Operation *op) {
  if (auto t = dyn_cast<TransposeOp>(op)) return movesNoData(t);
  return isa<ReshapeOp, SqueezeOp, UnsqueezeOp, FlattenOp, IdentityOp>(op);
}

struct BufferizePass : sd::impl::BufferizeBase<BufferizePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    dropUnusedBodies(module);
    SmallVector<func::FuncOp> entries;
    for (auto f : module.getOps<func::FuncOp>())
      if (sd::isEntry(f)) entries.push_back(f);
    for (func::FuncOp f : entries)
      if (failed(bufferize(module, f))) return signalPassFailure();
  }

  // A Loop or If step whose results nothing used was erased with its uses;
  // its bodies (and the bodies only they ran) would be dead entries.
  static void dropUnusedBodies(ModuleOp module) {
    for (bool changed = true; changed;) {
      changed = false;
      llvm::StringSet<> used;
      module.walk([&](LoopOp loop) { used.insert(loop.getBody()); });
      module.walk([&](IfOp step) { used.insert(step.getThenBody()), used.insert(step.getElseBody()); });
      for (auto f : llvm::make_early_inc_range(module.getOps<func::FuncOp>()))
        if (f->hasAttr("sd.body") && !used.contains(f.getName())) f.erase(), changed = true;
    }
  }

  // Constants become constant-role globals, shared across entries.
  StringAttr globalForConstant(ModuleOp module, ConstantOp c) {
    auto it = constGlobals.find(c.getValue());
    if (it != constGlobals.end()) return it->second;
    OpBuilder b = OpBuilder::atBlockBegin(module.getBody());
    std::string name = "__constant_" + std::to_string(constGlobals.size());
    auto g = b.create<GlobalOp>(c.getLoc(), b.getStringAttr(name), TypeAttr::get(c.getType()), b.getStringAttr("constant"),
                                c.getValue());
    StringAttr sym = g.getSymNameAttr();
    constGlobals[c.getValue()] = sym;
    return sym;
  }

  // A value stored into a global is computed straight into the global's
  // buffer when that cannot clobber a read: its producer is a kernel step, the
  // store is its only use, and every earlier load of the global is last used
  // by the producer itself or before it (an optimizer update reading and
  // writing a parameter, a gradient accumulated in place). Other stores copy.
  // Loads read the global's current value, so a load after a store sees it.
  LogicalResult planStores(func::FuncOp f, llvm::DenseMap<Value, StringAttr> &inPlace) {
    llvm::DenseMap<Operation *, int64_t> pos;
    llvm::StringMap<SmallVector<GlobalLoadOp>> loads;
    for (Operation &op : f.getBody().front()) {
      pos[&op] = int64_t(pos.size());
      if (auto load = dyn_cast<GlobalLoadOp>(op)) loads[load.getGlobal()].push_back(load);
    }
    for (Operation &op : f.getBody().front()) {
      auto store = dyn_cast<GlobalStoreOp>(op);
      if (!store) continue;
      Operation *producer = store.getValue().getDefiningOp();
      int64_t storeAt = pos.lookup(store), readsUntil = -1; // last read of the old value, besides the producer
      for (GlobalLoadOp load : loads.lookup(store.getGlobal())) {
        if (pos.lookup(load) > storeAt) continue;
        for (Operation *u : load.getResult().getUsers()) {
          if (pos.lookup(u) > storeAt)
            return store.emitError() << "global '" << store.getGlobal() << "' is read after it is stored";
          if (u != producer) readsUntil = std::max(readsUntil, pos.lookup(u));
        }
      }
      if (producer && isa<ComputeOpInterface>(producer) && !isAlias(producer) && store.getValue().hasOneUse() &&
          readsUntil < pos.lookup(producer))
        inPlace[store.getValue()] = store.getGlobalAttr().getAttr();
    }
    return success();
  }

  LogicalResult bufferize(ModuleOp module, func::FuncOp f) {
    llvm::DenseMap<Value, StringAttr> inPlace;
    if (failed(planStores(f, inPlace))) return failure();
    OpBuilder b(f);
    auto stepFn = b.create<func::FuncOp>(f.getLoc(), f.getName(), b.getFunctionType({}, {}));
    for (NamedAttribute a : f->getAttrs())
      if (a.getName().strref().starts_with("sd.")) stepFn->setAttr(a.getName(), a.getValue());
    Block *block = stepFn.addEntryBlock();
    b.setInsertionPointToStart(block);
    IRMapping map;
    SmallVector<Attribute> inputNames;
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      auto nameAttr = f.getArgAttrOfType<StringAttr>(i, "sd.name");
      std::string name = nameAttr ? nameAttr.str() : "input" + std::to_string(i);
      auto buf = b.create<BufferOp>(f.getLoc(), toMemRef(f.getArgument(i).getType()), b.getStringAttr(name),
                                    IntegerAttr(), DenseI64ArrayAttr());
      map.map(f.getArgument(i), buf.getResult());
      inputNames.push_back(b.getStringAttr(name));
    }
    stepFn->setAttr("sd.input_names", b.getArrayAttr(inputNames));
    for (Operation &op : f.getBody().front()) {
      Location loc = op.getLoc();
      if (auto load = dyn_cast<GlobalLoadOp>(op)) {
        map.map(load.getResult(), b.create<GlobalBufferOp>(loc, toMemRef(load.getType()), load.getGlobal()));
      } else if (auto c = dyn_cast<ConstantOp>(op)) {
        StringAttr g = globalForConstant(module, c);
        map.map(c.getResult(), b.create<GlobalBufferOp>(loc, toMemRef(c.getType()), g.getValue()));
      } else if (auto n = dyn_cast<NoneOp>(op)) {
        map.map(n.getResult(), b.create<NoneOp>(loc, b.getNoneType()));
      } else if (isAlias(&op)) {
        Value src = map.lookup(op.getOperand(0));
        map.map(op.getResult(0), b.create<ViewOp>(loc, toMemRef(op.getResult(0).getType()), src));
      } else if (auto compute = dyn_cast<ComputeOpInterface>(op)) {
        SmallVector<Value> ins, outs;
        for (Value v : op.getOperands()) ins.push_back(map.lookup(v));
        for (Value r : op.getResults()) {
          Value buf;
          if (StringAttr g = inPlace.lookup(r)) buf = b.create<GlobalBufferOp>(loc, toMemRef(r.getType()), g.getValue());
          else buf = b.create<BufferOp>(loc, toMemRef(r.getType()), StringAttr(), IntegerAttr(), DenseI64ArrayAttr());
          outs.push_back(buf);
          map.map(r, buf);
        }
        b.create<StepOp>(loc, b.getStringAttr(compute.getContractName()), op.getAttrDictionary(), ins, outs);
      } else if (auto store = dyn_cast<GlobalStoreOp>(op)) {
        if (inPlace.count(store.getValue())) continue;
        Value dst = b.create<GlobalBufferOp>(loc, toMemRef(store.getValue().getType()), store.getGlobal());
        b.create<StepOp>(loc, b.getStringAttr("Identity"), b.getDictionaryAttr({}), ValueRange{map.lookup(store.getValue())},
                         ValueRange{dst});
      } else if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        auto names = f->getAttrOfType<ArrayAttr>("sd.output_names");
        // sd-bounded-extents: [result, count result, axis] per counted output;
        // the count results are not outputs of their own.
        llvm::DenseMap<unsigned, std::pair<unsigned, int64_t>> counted;
        llvm::DenseSet<unsigned> counts;
        if (auto extents = f->getAttrOfType<ArrayAttr>("sd.output_extents"))
          for (Attribute a : extents) {
            ArrayRef<int64_t> e = cast<DenseI64ArrayAttr>(a).asArrayRef();
            counted[unsigned(e[0])] = {unsigned(e[1]), e[2]};
            counts.insert(unsigned(e[1]));
          }
        for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
          if (counts.contains(unsigned(i))) continue;
          std::string name = names && i < names.size() ? cast<StringAttr>(names[i]).str() : "output" + std::to_string(i);
          auto it = counted.find(unsigned(i));
          if (it == counted.end()) {
            b.create<OutputOp>(loc, name, map.lookup(v), Value(), IntegerAttr());
            continue;
          }
          b.create<OutputOp>(loc, name, map.lookup(v), map.lookup(ret.getOperand(it->second.first)),
                             b.getI64IntegerAttr(it->second.second));
        }
      } else {
        return op.emitError() << sd::describeNode(&op) << ": cannot bufferize this op";
      }
    }
    b.create<func::ReturnOp>(f.getLoc());
    f.erase();
    return success();
  }

  llvm::DenseMap<Attribute, StringAttr> constGlobals;
};

} // namespace
