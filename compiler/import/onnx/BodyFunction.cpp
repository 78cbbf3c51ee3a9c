#include "BodyFunction.h"
#include "SDDialect.h"
#include "mlir/IR/SymbolTable.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {

std::string freshBodyName(ModuleOp module, StringRef prefix) {
  for (int k = 0;; ++k) {
    std::string name = (prefix + std::to_string(k)).str();
    if (!SymbolTable::lookupSymbolIn(module, name)) return name;
  }
}

func::FuncOp enclosingFunction(OpBuilder &b) {
  Operation *op = b.getInsertionBlock()->getParentOp();
  auto f = dyn_cast<func::FuncOp>(op);
  return f ? f : op->getParentOfType<func::FuncOp>();
}

func::FuncOp createBodyFunction(OpBuilder &b, func::FuncOp caller, StringRef name, TypeRange argTypes, Location loc) {
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointAfter(caller);
  auto fn = b.create<func::FuncOp>(loc, name, b.getFunctionType(argTypes, {}));
  fn->setAttr("sd.body", b.getUnitAttr());
  fn.addEntryBlock();
  return fn;
}

SmallVector<Value> captureOuterValues(func::FuncOp body) {
  Block &block = body.getBody().front();
  OpBuilder b = OpBuilder::atBlockBegin(&block);
  llvm::DenseMap<Value, Value> local;
  SmallVector<Value> outer;
  SmallVector<Operation *> ops;
  body.walk([&](Operation *op) { ops.push_back(op); });
  for (Operation *op : ops)
    for (OpOperand &use : op->getOpOperands()) {
      Value v = use.get();
      if (v.getParentRegion() == &body.getBody()) continue;
      auto it = local.find(v);
      if (it == local.end()) {
        Operation *def = v.getDefiningOp();
        Value mine;
        if (def && isa<ConstantOp, NoneOp, GlobalLoadOp>(def)) {
          mine = b.clone(*def)->getResult(0);
        } else {
          mine = block.addArgument(v.getType(), v.getLoc());
          outer.push_back(v);
        }
        it = local.try_emplace(v, mine).first;
      }
      use.set(it->second);
    }
  return outer;
}

void finishBodyFunction(func::FuncOp body, ArrayRef<std::string> argNames, ArrayRef<std::string> outputNames) {
  Block &block = body.getBody().front();
  Builder b(body.getContext());
  body.setType(b.getFunctionType(block.getArgumentTypes(), block.getTerminator()->getOperandTypes()));
  for (unsigned i = 0; i < body.getNumArguments() && i < argNames.size(); ++i)
    body.setArgAttr(i, "sd.name", b.getStringAttr(argNames[i]));
  SmallVector<Attribute> outs;
  for (const std::string &n : outputNames) outs.push_back(b.getStringAttr(n));
  body->setAttr("sd.entry", b.getStringAttr(body.getName()));
  body->setAttr("sd.bucket", b.getDictionaryAttr({}));
  body->setAttr("sd.output_names", b.getArrayAttr(outs));
}

std::string typeText(Type t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  t.print(os);
  return s;
}

} // namespace sd
