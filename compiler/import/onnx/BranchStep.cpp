// If steps: an ONNX If on run-time data normally computes both branches and
// selects (sd.if_select), which keeps an entry one fixed list of steps. When
// the branches are costly, the importer moves each into a body function of
// its own (a plan entry marked `body`) and puts one sd.if in their place: a
// run executes only the taken branch. The branches are imported inline first
// (exactly as for a select), so the choice can weigh what they cost.
#include "BranchStep.h"
#include "BodyFunction.h"
#include "OpLibraryBridge.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/SmallPtrSet.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {

namespace {

double elements(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t ? double(t.getNumElements()) : 0;
}

// Multiply-adds per result element of a matrix product or convolution
// (0: not one): K, or a filter's elements per output channel.
double reductionLength(Operation *op) {
  auto dims = [&](unsigned i) { return cast<RankedTensorType>(op->getOperand(i).getType()).getShape(); };
  auto filter = [&](unsigned i) {
    ArrayRef<int64_t> w = dims(i);
    return w.empty() || w[0] <= 0 ? 0.0 : elements(op->getOperand(i)) / double(w[0]);
  };
  if (isa<MatMulOp, MatMulIntegerOp>(op)) return dims(0).empty() ? 0 : double(dims(0).back());
  if (isa<QLinearMatMulOp>(op)) return dims(0).empty() ? 0 : double(dims(0).back());
  if (auto g = dyn_cast<GemmOp>(op)) {
    ArrayRef<int64_t> a = dims(0);
    return a.size() != 2 ? 0 : double(g.getTransA().value_or(0) ? a[0] : a[1]);
  }
  if (isa<ConvOp, FusedConvOp, ConvIntegerOp>(op)) return filter(1);
  if (isa<QLinearConvOp>(op)) return filter(3);
  return 0;
}

std::optional<double> costOf(Operation *op, int depth);

std::optional<double> bodyCost(Operation *op, StringRef body, int depth) {
  auto fn = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(op, StringAttr::get(op->getContext(), body));
  if (!fn || depth > 16) return std::nullopt;
  double sum = 0;
  for (Operation &inner : fn.getBody().front()) {
    std::optional<double> c = costOf(&inner, depth + 1);
    if (!c) return std::nullopt;
    sum += *c;
  }
  return sum;
}

std::optional<double> costOf(Operation *op, int depth) {
  if (auto loop = dyn_cast<LoopOp>(op)) {
    std::optional<double> body = bodyCost(op, loop.getBody(), depth);
    return body ? std::optional<double>(*body * double(loop.getMaxTrips())) : std::nullopt;
  }
  if (auto branch = dyn_cast<IfOp>(op)) {
    std::optional<double> t = bodyCost(op, branch.getThenBody(), depth), e = bodyCost(op, branch.getElseBody(), depth);
    return t && e ? std::optional<double>(std::max(*t, *e)) : std::nullopt;
  }
  double in = 0, out = 0;
  for (Value v : op->getResults()) {
    if (auto t = dyn_cast<RankedTensorType>(v.getType()); t && !t.hasStaticShape()) return std::nullopt;
    out += elements(v);
  }
  for (Value v : op->getOperands()) in += elements(v);
  double k = reductionLength(op);
  return k > 0 ? out * k : std::max(in, out);
}

bool staticTypes(ValueRange values) {
  return llvm::all_of(values.getTypes(), [](Type t) {
    auto r = dyn_cast<RankedTensorType>(t);
    return r && r.hasStaticShape();
  });
}

// The ops as a body function named `name`, after the caller; its outer-scope
// operands become arguments (returned in `outer`).
func::FuncOp outline(OpBuilder &b, func::FuncOp caller, const std::string &name, ArrayRef<Operation *> ops,
                     ArrayRef<Value> outs, Location loc, SmallVector<Value> &outer) {
  func::FuncOp fn = createBodyFunction(b, caller, name, {}, loc);
  OpBuilder fb = OpBuilder::atBlockEnd(&fn.getBody().front());
  IRMapping map;
  for (Operation *op : ops) fb.clone(*op, map);
  SmallVector<Value> results;
  for (Value v : outs) results.push_back(map.lookupOrDefault(v));
  fb.create<func::ReturnOp>(loc, results);
  outer = captureOuterValues(fn);
  std::vector<std::string> argNames, outNames;
  for (size_t i = 0; i < outer.size(); ++i) argNames.push_back("outer_" + std::to_string(i));
  for (size_t i = 0; i < outs.size(); ++i) outNames.push_back("out_" + std::to_string(i));
  finishBodyFunction(fn, argNames, outNames);
  return fn;
}

} // namespace

std::optional<int64_t> estimatedCost(ArrayRef<Operation *> ops) {
  double sum = 0;
  for (Operation *op : ops) {
    std::optional<double> c = costOf(op, 0);
    if (!c) return std::nullopt;
    sum += *c;
  }
  return int64_t(std::min(sum, 9.0e18));
}

IfOp emitBranchStep(NodeImporter &imp, const BranchStepSpec &spec) {
  if (spec.thenOuts.size() != spec.elseOuts.size() || !staticTypes(spec.thenOuts) ||
      ValueRange(spec.thenOuts).getTypes() != ValueRange(spec.elseOuts).getTypes())
    return nullptr;
  // Each branch must be self-contained: nothing outside its ops reads them
  // (the importer's later nodes see only the If's results).
  llvm::SmallPtrSet<Operation *, 16> thenSet(spec.thenOps.begin(), spec.thenOps.end()),
      elseSet(spec.elseOps.begin(), spec.elseOps.end());
  auto closed = [](ArrayRef<Operation *> ops, const llvm::SmallPtrSetImpl<Operation *> &set) {
    return llvm::all_of(ops, [&](Operation *op) {
      return llvm::all_of(op->getUsers(), [&](Operation *user) { return set.contains(user); });
    });
  };
  if (!closed(spec.thenOps, thenSet) || !closed(spec.elseOps, elseSet)) return nullptr;

  OpBuilder &b = imp.builder;
  func::FuncOp caller = enclosingFunction(b);
  auto module = caller->getParentOfType<ModuleOp>();
  SmallVector<Value> thenOuter, elseOuter;
  // The else body first: each is placed right after the caller, so the then
  // body ends up first.
  std::string elseName = freshBodyName(module, "if_else_");
  func::FuncOp elseFn = outline(b, caller, elseName, spec.elseOps, spec.elseOuts, imp.loc, elseOuter);
  std::string thenName = freshBodyName(module, "if_then_");
  func::FuncOp thenFn = outline(b, caller, thenName, spec.thenOps, spec.thenOuts, imp.loc, thenOuter);
  auto inBranch = [&](Value v) {
    Operation *def = v.getDefiningOp();
    return def && (thenSet.contains(def) || elseSet.contains(def));
  };
  if (!staticTypes(thenOuter) || !staticTypes(elseOuter) || llvm::any_of(thenOuter, inBranch) ||
      llvm::any_of(elseOuter, inBranch)) {
    thenFn.erase(), elseFn.erase();
    return nullptr;
  }

  SmallVector<Value> operands = {spec.condition};
  operands.append(thenOuter.begin(), thenOuter.end());
  operands.append(elseOuter.begin(), elseOuter.end());
  auto step = b.create<IfOp>(imp.loc, ValueRange(spec.thenOuts).getTypes(), operands, b.getStringAttr(thenName),
                             b.getStringAttr(elseName), b.getI64IntegerAttr(int64_t(thenOuter.size())));
  // The inline copies go; so do names bound to them (a weight's first load).
  for (auto it = imp.values.begin(); it != imp.values.end();) {
    Operation *def = it->second.getDefiningOp();
    it = def && (thenSet.contains(def) || elseSet.contains(def)) ? imp.values.erase(it) : std::next(it);
  }
  for (Operation *op : llvm::reverse(spec.elseOps)) op->erase();
  for (Operation *op : llvm::reverse(spec.thenOps)) op->erase();
  return step;
}

} // namespace sd
