// Loop steps: a loop too long to unroll keeps one copy of its body, outlined
// into a loop-body function that becomes its own plan entry, and sd.loop runs
// that entry once per iteration. The body is imported once with its own
// arguments (iteration number, condition, carried values); the outer-scope
// values it reads become further arguments, except constants and weights,
// which are copied in (a body reads globals like any entry). Every carried
// value must keep its static type from one iteration to the next, because
// the plan's buffers have one shape.
#include "LoopStep.h"
#include "BodyFunction.h"
#include "OnnxImporter.h"
#include "OpLibraryBridge.h"
#include "llvm/ADT/ScopeExit.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {

namespace {

bool definedIn(Value v, func::FuncOp f) { return v.getParentRegion() == &f.getBody(); }

} // namespace

FailureOr<LoopOp> emitLoopStep(NodeImporter &imp, const LoopStepSpec &spec) {
  OpBuilder &b = imp.builder;
  Block *outerBlock = b.getInsertionBlock();
  auto module = outerBlock->getParentOp()->getParentOfType<ModuleOp>();
  for (auto [i, v] : llvm::enumerate(spec.carried))
    if (!isStatic(v))
      return imp.fail("loop-carried value " + std::to_string(i) + " has a run-time shape (" + typeText(v.getType()) +
                      ") at import; a loop step needs static shapes: give one --shapes bucket (several leave "
                      "dims open until specialization), or --max-unroll " + std::to_string(spec.maxTrips) +
                      " to unroll it"),
             failure();

  std::string name = freshBodyName(module, "loop_body_");
  Location loc = imp.loc;

  OpBuilder::InsertPoint outerPoint = b.saveInsertionPoint();
  auto restore = llvm::make_scope_exit([&] { b.restoreInsertionPoint(outerPoint); });
  Type i64 = b.getI64Type(), i1 = b.getI1Type();
  auto ones = [](int rank) { return SmallVector<int64_t>(size_t(rank), 1); };
  SmallVector<Type> argTypes = {RankedTensorType::get(ones(spec.iterationRank), i64),
                                RankedTensorType::get(ones(spec.conditionRank), i1)};
  for (Value v : spec.carried) argTypes.push_back(v.getType());
  func::FuncOp fn = createBodyFunction(b, enclosingFunction(b), name, argTypes, loc);
  Block *block = &fn.getBody().front();
  b.setInsertionPointToStart(block);

  // An iteration only runs while the condition holds, so the body sees it
  // true: a constant, which lets a body that passes it on fold it.
  SmallVector<Value> args(block->getArguments());
  auto condArg = cast<RankedTensorType>(args[1].getType());
  args[1] = b.create<ConstantOp>(loc, condArg, DenseElementsAttr::get(condArg, b.getBoolAttr(true)));
  // Names the body binds lazily (a weight's first load) must not outlive it.
  auto outs = spec.importBody(args);
  for (auto it = imp.values.begin(); it != imp.values.end();)
    it = definedIn(it->second, fn) ? imp.values.erase(it) : std::next(it);
  if (failed(outs)) return fn.erase(), failure();
  auto fail = [&](const std::string &message) -> FailureOr<LoopOp> {
    fn.erase();
    return imp.fail(message), failure();
  };
  const size_t numCarried = spec.carried.size();
  if (outs->size() < 1 + numCarried) return fail("its body gives fewer outputs than it carries values");
  auto condType = cast<RankedTensorType>((*outs)[0].getType());
  if (!condType.getElementType().isInteger(1) || !condType.hasStaticShape() || condType.getNumElements() != 1)
    return fail("its body's condition is " + typeText(condType) + ", not one bool");
  for (size_t i = 0; i < numCarried; ++i)
    if ((*outs)[1 + i].getType() != spec.carried[i].getType())
      return fail("loop-carried value " + std::to_string(i) + " changes type from " +
                  typeText(spec.carried[i].getType()) + " to " + typeText((*outs)[1 + i].getType()) +
                  " in one iteration; a loop step keeps one static type (raise --max-unroll to unroll it instead)");
  SmallVector<Type> resultTypes(ValueRange(spec.carried).getTypes());
  for (size_t k = 1 + numCarried; k < outs->size(); ++k) {
    auto slice = cast<RankedTensorType>((*outs)[k].getType());
    if (!slice.hasStaticShape()) return fail("scan output " + std::to_string(k - 1 - numCarried) + " has a run-time shape");
    SmallVector<int64_t> stacked = {spec.maxTrips};
    stacked.append(slice.getShape().begin(), slice.getShape().end());
    resultTypes.push_back(RankedTensorType::get(stacked, slice.getElementType()));
  }
  b.create<func::ReturnOp>(loc, *outs);

  SmallVector<Value> invariants = captureOuterValues(fn);
  std::vector<std::string> argNames = {"iteration", "cond"}, outNames = {"cond"};
  for (size_t i = 0; i < numCarried; ++i) argNames.push_back("carried_" + std::to_string(i));
  for (size_t i = 0; i < invariants.size(); ++i) argNames.push_back("outer_" + std::to_string(i));
  for (size_t i = 0; i < numCarried; ++i) outNames.push_back("carried_" + std::to_string(i));
  for (size_t k = 1 + numCarried; k < outs->size(); ++k) outNames.push_back("scan_" + std::to_string(k - 1 - numCarried));
  finishBodyFunction(fn, argNames, outNames);

  // The step, where the node was.
  b.restoreInsertionPoint(outerPoint);
  auto scalar = [&](Type et, Attribute v) {
    auto t = RankedTensorType::get({}, et);
    return b.create<ConstantOp>(loc, t, DenseElementsAttr::get(t, v)).getResult();
  };
  Value trip = spec.trip ? spec.trip : scalar(i64, b.getI64IntegerAttr(spec.maxTrips));
  Value cond = spec.condition ? spec.condition : scalar(i1, b.getBoolAttr(true));
  SmallVector<Value> operands = {trip, cond};
  operands.append(spec.carried.begin(), spec.carried.end());
  operands.append(invariants.begin(), invariants.end());
  auto loop = b.create<LoopOp>(loc, resultTypes, operands, b.getStringAttr(name), b.getI64IntegerAttr(spec.maxTrips),
                               b.getI64IntegerAttr(int64_t(numCarried)), b.getStringAttr(spec.overflowMessage));
  return loop;
}

} // namespace sd
