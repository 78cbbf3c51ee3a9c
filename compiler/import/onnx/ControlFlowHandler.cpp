// ONNX control flow made static at import, because a plan replays a fixed list
// of steps with as few host-side decisions as possible:
// - If: a condition the importer can compute (constants, --bind, static
//   shapes) compiles only the taken branch. Otherwise both branches are
//   computed and sd.if_select picks one; sd-propagate-shapes folds it when
//   specialization makes the condition a constant. Branches have no side
//   effects in ONNX, so the only cost of selecting is computing both; when
//   that costs too much (--max-select), an inference plan gets an If step
//   that runs only the taken branch (BranchStep.h).
// - Loop and Scan unroll: one inline copy of the body per iteration. A Loop
//   whose stop is run-time data runs up to --max-trip copies, each keeping its
//   state when the loop has stopped (sd.if_select), and sd.loop_guard fails
//   the run if the loop still wanted to go on. Longer loops become a loop
//   step over an outlined body (LoopStep.h).
#include "ControlFlowHandler.h"
#include "BranchStep.h"
#include "LoopStep.h"
#include "OnnxImporter.h"
#include "OpLibraryBridge.h"
#include "OpMaker.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {

namespace {

// A value the importer can compute is a constant by the time a handler sees
// it: importNodes folds each node whose operands are known (foldOutputs).
DenseElementsAttr knownValue(Value v) { return dyn_cast_or_null<DenseElementsAttr>(constantValue(v)); }

const onnx::GraphProto *graphAttr(const onnx::NodeProto &n, const char *name) {
  const onnx::AttributeProto *a = attrOf(n, name);
  return a && a->type() == onnx::AttributeProto::GRAPH ? &a->g() : nullptr;
}

std::vector<int64_t> intsAttr(const onnx::NodeProto &n, const char *name) {
  const onnx::AttributeProto *a = attrOf(n, name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>();
}

// The rank a subgraph declares for input i (0 when it declares none).
int declaredRank(const onnx::GraphProto &g, int i) {
  const auto &t = g.input(i).type();
  return t.has_tensor_type() && t.tensor_type().has_shape() ? t.tensor_type().shape().dim_size() : 0;
}

Value constOf(NodeImporter &imp, Type et, int64_t v, int rank) {
  auto type = RankedTensorType::get(SmallVector<int64_t>(size_t(rank), 1), et);
  Attribute a = et.isInteger(1) ? Attribute(imp.builder.getBoolAttr(v != 0)) : imp.builder.getIntegerAttr(et, v);
  return imp.builder.create<ConstantOp>(imp.loc, type, DenseElementsAttr::get(type, a));
}

LogicalResult bindOutputs(NodeImporter &imp, const onnx::NodeProto &n, ArrayRef<Value> values) {
  if (n.output_size() > int(values.size()))
    return imp.fail("has " + std::to_string(n.output_size()) + " outputs, its subgraph gives " +
                    std::to_string(values.size()));
  for (int i = 0; i < n.output_size(); ++i)
    if (!n.output(i).empty()) imp.values[n.output(i)] = values[size_t(i)];
  return success();
}

// One bool: true when every element of a known condition is (ONNX conditions hold one).
std::optional<bool> knownBool(NodeImporter &imp, Value v) {
  DenseElementsAttr c = knownValue(v);
  if (!c || c.getNumElements() != 1 || !c.getElementType().isInteger(1)) return std::nullopt;
  return *c.value_begin<bool>();
}

// Stacks per-iteration values along a new axis (negative: from the end).
Value stack(OpMaker &m, ArrayRef<Value> parts, int64_t axis) {
  int64_t rank = cast<RankedTensorType>(parts[0].getType()).getRank() + 1;
  if (axis < 0) axis += rank;
  SmallVector<Value> lifted;
  for (Value p : parts) lifted.push_back(m.op("Unsqueeze", "unsqueeze", {p, m.imp.constI64({axis})}));
  if (lifted.size() == 1) return lifted[0];
  return m.op("Concat", "concat", lifted, {m.i64("axis", axis)});
}

} // namespace

LogicalResult importIf(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"then_branch", "else_branch"}))) return failure();
  const onnx::GraphProto *thenG = graphAttr(n, "then_branch"), *elseG = graphAttr(n, "else_branch");
  if (!thenG || !elseG) return imp.fail("needs then_branch and else_branch graphs");
  auto cond = imp.lookup(n.input(0));
  if (failed(cond)) return failure();
  std::string name = imp.nodeName;
  if (std::optional<bool> taken = knownBool(imp, *cond)) {
    auto outs = importSubgraph(imp, *taken ? *thenG : *elseG, *taken ? "then_branch" : "else_branch", {});
    if (failed(outs)) return failure();
    imp.controlFlowNotes.push_back("If '" + name + "': condition known at compile time, " +
                                   (*taken ? "then" : "else") + "_branch compiled alone");
    return bindOutputs(imp, n, *outs);
  }
  // A branch written for other shapes than these may not import: say how to
  // compile only the taken one.
  auto hint = [&] {
    imp.error += "; the If condition is run-time data, so both branches are compiled: --bind the inputs it "
                 "depends on to compile only the taken one";
    return failure();
  };
  // Each branch's ops, as imported inline (an If step moves them).
  OpBuilder &b = imp.builder;
  Block *block = b.getInsertionBlock();
  auto lastOp = [&]() -> Operation * {
    return b.getInsertionPoint() == block->begin() ? nullptr : &*std::prev(b.getInsertionPoint());
  };
  auto opsAfter = [&](Operation *mark) {
    SmallVector<Operation *> ops;
    for (auto it = mark ? std::next(Block::iterator(mark)) : block->begin(); it != b.getInsertionPoint(); ++it)
      ops.push_back(&*it);
    return ops;
  };
  BranchStepSpec branches;
  branches.condition = *cond;
  Operation *mark = lastOp();
  auto thenOuts = importSubgraph(imp, *thenG, "then_branch", {});
  if (failed(thenOuts)) return hint();
  branches.thenOps = opsAfter(mark);
  mark = lastOp();
  auto elseOuts = importSubgraph(imp, *elseG, "else_branch", {});
  if (failed(elseOuts)) return hint();
  branches.elseOps = opsAfter(mark);
  if (thenOuts->size() != elseOuts->size())
    return imp.fail("then_branch gives " + std::to_string(thenOuts->size()) + " outputs, else_branch " +
                    std::to_string(elseOuts->size()));
  auto isSequence = [&](Value v) { return imp.isSequence(v); };
  if (llvm::any_of(*thenOuts, isSequence) || llvm::any_of(*elseOuts, isSequence))
    return imp.fail("its branches give sequences and the condition is run-time data: choosing a sequence at run "
                    "time is not supported (sequences are lists sdc keeps at compile time)");
  branches.thenOuts = *thenOuts;
  branches.elseOuts = *elseOuts;

  // The rule: a branch step when the plan is for inference and the cheaper
  // branch costs more than --max-select (the other costs at least as much, so
  // selecting would at least double the work); otherwise select.
  const int64_t maxSelect = imp.options->maxSelect;
  std::optional<int64_t> thenCost = estimatedCost(branches.thenOps), elseCost = estimatedCost(branches.elseOps);
  std::string why;
  if (imp.options->training)
    why = "a training plan selects: a branch step has no gradient";
  else if (!thenCost || !elseCost)
    why = "shapes not static at import";
  else if (std::min(*thenCost, *elseCost) <= maxSelect)
    why = "the cheaper branch costs " + std::to_string(std::min(*thenCost, *elseCost)) + ", at most --max-select " +
          std::to_string(maxSelect);
  else if (IfOp step = emitBranchStep(imp, branches)) {
    imp.controlFlowNotes.push_back("If '" + name + "': condition is run-time data: an If step runs entry '" +
                                   step.getThenBody().str() + "' or '" + step.getElseBody().str() +
                                   "' (branches cost " + std::to_string(*thenCost) + " and " +
                                   std::to_string(*elseCost) + ", more than --max-select " +
                                   std::to_string(maxSelect) + ")");
    return bindOutputs(imp, n, SmallVector<Value>(step->getResults()));
  } else
    why = "its branches cannot be steps (outputs or outer values of run-time shape, or of different types)";
  OpMaker m{imp};
  SmallVector<Value> selected;
  for (auto [t, e] : llvm::zip(*thenOuts, *elseOuts)) selected.push_back(m.op("IfSelect", "if_select", {*cond, t, e}));
  if (!m.ok) return failure();
  imp.controlFlowNotes.push_back("If '" + name + "': condition is run-time data: both branches computed, then " +
                                 std::to_string(selected.size()) + " output(s) selected (" + why + ")");
  return bindOutputs(imp, n, selected);
}

// A Loop of more than --max-unroll iterations: one loop step over its body.
// `trip` is M when it is run-time data (else null), `limit` the most
// iterations the plan allows (M, or --max-trip).
LogicalResult importLoopStep(NodeImporter &imp, const onnx::NodeProto &n, const onnx::GraphProto &body, Value trip,
                             Value cond, ArrayRef<Value> carried, int64_t limit, bool tripKnown) {
  const ImportOptions &opts = *imp.options;
  std::string name = imp.nodeName;
  LoopStepSpec spec;
  spec.trip = trip;
  spec.condition = cond;
  spec.carried.assign(carried.begin(), carried.end());
  spec.maxTrips = limit;
  spec.iterationRank = declaredRank(body, 0);
  spec.conditionRank = declaredRank(body, 1);
  spec.overflowMessage = imp.scope + ": Loop '" + name + "' needs more than --max-trip " + std::to_string(limit) +
                         " iterations; recompile with a larger --max-trip";
  auto importBody = [&](ArrayRef<Value> args) { return importSubgraph(imp, body, "body", args); };
  spec.importBody = importBody; // a function_ref: the lambda must outlive it
  auto made = emitLoopStep(imp, spec);
  if (failed(made)) return failure();
  // Scan outputs stack every iteration: the loop must run all of them.
  LoopOp loop = *made;
  size_t numScans = loop.getNumResults() - carried.size();
  bool stopsEarly = !tripKnown || (cond && !knownBool(imp, cond));
  if (!stopsEarly) {
    auto bodyFn = loop->getParentOfType<ModuleOp>().lookupSymbol<func::FuncOp>(loop.getBody());
    Value next = bodyFn.getBody().front().getTerminator()->getOperand(0);
    std::optional<bool> c = knownBool(imp, next);
    stopsEarly = !c || !*c;
  }
  if (stopsEarly && numScans)
    return imp.fail("has scan outputs and stops at run time, so their length is run-time data; give a "
                    "trip count the importer can compute");
  imp.controlFlowNotes.push_back("Loop '" + name + "': loop step over entry '" + loop.getBody().str() + "', up to " +
                                 std::to_string(limit) + " iteration(s)" +
                                 (stopsEarly ? ", stopping on run-time data" : "") +
                                 (tripKnown ? "" : ", guarded at --max-trip " + std::to_string(opts.maxTrip)) +
                                 " (more than --max-unroll " + std::to_string(opts.maxUnroll) + ")");
  return bindOutputs(imp, n, SmallVector<Value>(loop.getResults()));
}

LogicalResult importLoop(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"body"}))) return failure();
  const onnx::GraphProto *body = graphAttr(n, "body");
  if (!body) return imp.fail("needs a body graph");
  auto tripInput = optionalInput(imp, n, 0), condInput = optionalInput(imp, n, 1);
  if (failed(tripInput) || failed(condInput)) return failure();
  SmallVector<Value> carried;
  for (int i = 2; i < n.input_size(); ++i) {
    auto v = imp.lookupAny(n.input(i)); // a sequence built up iteration by iteration (EmbeddingBag's)
    if (failed(v)) return failure();
    carried.push_back(*v);
  }
  size_t numCarried = carried.size();
  bool carriesSequence = llvm::any_of(carried, [&](Value v) { return imp.isSequence(v); });
  if (body->input_size() != int(numCarried) + 2 || body->output_size() < int(numCarried) + 1)
    return imp.fail("body takes " + std::to_string(body->input_size()) + " inputs and gives " +
                    std::to_string(body->output_size()) + " outputs; the node carries " + std::to_string(numCarried) +
                    " values (2 + N inputs, 1 + N + K outputs expected)");
  size_t numScans = size_t(body->output_size()) - 1 - numCarried;
  const ImportOptions &opts = *imp.options;
  std::string name = imp.nodeName;
  auto maxTripHint = "give --max-trip N, or --bind the inputs it depends on";

  // The trip count: a known M, else --max-trip. PyTorch's while loops give
  // M = INT64_MAX and stop on the condition: a known M of 2^31 or more is
  // treated as no bound.
  Value trip = *tripInput;
  bool tripKnown = false;
  // With no M and no --max-trip, a loop whose condition the importer can
  // compute each time (while i < n, n known) unrolls until it stops, up to
  // --max-unroll iterations.
  int64_t limit = opts.maxTrip ? opts.maxTrip : opts.maxUnroll, knownM = -1;
  if (trip) {
    DenseElementsAttr c = knownValue(trip);
    if (c && c.getNumElements() == 1) {
      knownM = std::max<int64_t>(0, (*c.value_begin<APInt>()).getSExtValue());
    } else if (!opts.maxTrip) {
      return imp.fail(std::string("trip count M is run-time data; ") + maxTripHint);
    }
  }
  constexpr int64_t kUnboundedTrips = int64_t(1) << 31;
  if (knownM >= 0 && knownM < kUnboundedTrips && (knownM <= opts.maxUnroll || knownM <= opts.maxTrip || !opts.maxTrip)) {
    tripKnown = true, limit = knownM, trip = Value();
  } else if (knownM >= kUnboundedTrips && !opts.maxTrip) {
    trip = Value(); // no bound: as without M, it unrolls while its condition is known
  }
  bool bounded = tripKnown || opts.maxTrip > 0;
  if (bounded && limit > opts.maxUnroll) {
    if (carriesSequence)
      return imp.fail("carries a sequence through " + std::to_string(limit) + " iterations, more than --max-unroll " +
                      std::to_string(opts.maxUnroll) + "; sequences live only in unrolled loops");
    return importLoopStep(imp, n, *body, trip, *condInput, carried, limit, tripKnown);
  }
  if (knownM >= 0) trip = Value(); // past --max-trip: the guard stops the loop first

  OpMaker m{imp};
  Type i64 = imp.builder.getI64Type(), i1 = imp.builder.getI1Type();
  Value condValue = *condInput;
  std::optional<bool> condStatic = condValue ? knownBool(imp, condValue) : std::optional<bool>(true);
  // `live`: the loop is still running, as run-time data (null: statically yes).
  Value live;
  if (!condStatic) live = condValue;
  if (live && !bounded) return imp.fail(std::string("loop condition is run-time data; ") + maxTripHint);
  bool stopped = condStatic && !*condStatic;
  // Whether iteration i runs, as run-time data (null: statically yes): the
  // loop is live and, for a run-time M under --max-trip, i < M.
  auto runsIteration = [&](Value live, int64_t i) -> Value {
    if (!trip) return live;
    Value below = m.op("Less", "less", {constOf(imp, i64, i, 0), trip});
    return live ? m.op("And", "and", {live, below}) : below;
  };
  SmallVector<SmallVector<Value>> scans(numScans);
  int64_t iterations = 0;
  for (; iterations < limit && !stopped; ++iterations) {
    Value keep = runsIteration(live, iterations);
    SmallVector<Value> inputs = {constOf(imp, i64, iterations, declaredRank(*body, 0)),
                                 condValue ? condValue : constOf(imp, i1, 1, declaredRank(*body, 1))};
    inputs.append(carried.begin(), carried.end());
    auto outs = importSubgraph(imp, *body, "body (iteration " + std::to_string(iterations) + ")", inputs);
    if (failed(outs)) return failure();
    if (keep && numScans)
      return imp.fail("has scan outputs and stops at run time, so their length is run-time data; give a "
                      "trip count the importer can compute");
    if (keep && carriesSequence)
      return imp.fail("carries a sequence and stops at run time, so its length is run-time data; give a trip "
                      "count the importer can compute");
    for (size_t i = 0; i < numCarried; ++i) {
      Value next = (*outs)[1 + i];
      carried[i] = keep ? m.op("IfSelect", "if_select", {keep, next, carried[i]}) : next;
    }
    for (size_t k = 0; k < numScans; ++k) scans[k].push_back((*outs)[1 + numCarried + k]);
    if (!m.ok) return failure();
    condValue = (*outs)[0];
    if (std::optional<bool> c = knownBool(imp, condValue)) {
      stopped = !*c;
    } else {
      if (!bounded) return imp.fail(std::string("loop condition is run-time data; ") + maxTripHint);
      live = live ? m.op("And", "and", {live, condValue}) : condValue;
    }
  }
  if (!stopped && !tripKnown) {
    // Ran out of unrolled iterations: fine only if the loop has stopped by now.
    std::string bound = opts.maxTrip ? "--max-trip " + std::to_string(opts.maxTrip) : "";
    if (!live && !trip)
      return imp.fail(opts.maxTrip ? "runs more than " + bound + " iterations"
                                   : "runs more than " + std::to_string(opts.maxUnroll) +
                                         " iterations, or stops on run-time data; " + maxTripHint);
    Value more = runsIteration(live, iterations);
    std::string message = imp.scope + ": Loop '" + name + "' needs more than " + bound +
                           " iterations; recompile with a larger --max-trip";
    for (Value &v : carried)
      v = m.op("LoopGuard", "loop_guard", {v, more},
               {imp.builder.getNamedAttr("message", imp.builder.getStringAttr(message))});
  }
  SmallVector<Value> results(carried);
  for (size_t k = 0; k < numScans; ++k) {
    if (scans[k].empty()) return imp.fail("runs no iteration, so its scan outputs would be empty");
    results.push_back(stack(m, scans[k], 0));
  }
  if (!m.ok) return failure();
  imp.controlFlowNotes.push_back(
      "Loop '" + name + "': unrolled " + std::to_string(iterations) + " iteration(s)" +
      (tripKnown || stopped ? "" : ", stopping on run-time data, guarded at --max-trip " + std::to_string(opts.maxTrip)));
  return bindOutputs(imp, n, results);
}

// Scan-9 and later: N state values, then M scan inputs sliced along their axes.
// Scan-8 has a leading batch axis on everything and an optional
// sequence_lens; each batch row is scanned on its own.
LogicalResult importScan(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"body", "num_scan_inputs", "directions", "scan_input_axes", "scan_input_directions",
                                "scan_output_axes", "scan_output_directions"})))
    return failure();
  const onnx::GraphProto *body = graphAttr(n, "body");
  const onnx::AttributeProto *numScanAttr = attrOf(n, "num_scan_inputs");
  if (!body || !numScanAttr) return imp.fail("needs a body graph and num_scan_inputs");
  bool batched = imp.opset < 9;
  int first = batched ? 1 : 0;
  int64_t numScanIn = numScanAttr->i();
  int64_t numState = n.input_size() - first - numScanIn;
  if (numScanIn < 1 || numState < 0) return imp.fail("num_scan_inputs " + std::to_string(numScanIn) + " does not fit its inputs");
  int64_t numScanOut = body->output_size() - numState;
  if (numScanOut < 0) return imp.fail("body gives fewer outputs than the state values");
  std::vector<int64_t> inAxes = intsAttr(n, "scan_input_axes"), inDirs = intsAttr(n, "scan_input_directions");
  if (batched) inDirs = intsAttr(n, "directions");
  std::vector<int64_t> outAxes = intsAttr(n, "scan_output_axes"), outDirs = intsAttr(n, "scan_output_directions");
  inAxes.resize(size_t(numScanIn), 0), inDirs.resize(size_t(numScanIn), 0);
  outAxes.resize(size_t(numScanOut), 0), outDirs.resize(size_t(numScanOut), 0);
  SmallVector<Value> states, scanIns;
  for (int i = first; i < n.input_size(); ++i) {
    auto v = imp.lookup(n.input(i));
    if (failed(v)) return failure();
    (i - first < numState ? states : scanIns).push_back(*v);
  }
  OpMaker m{imp};
  auto slice = [&](Value x, int64_t axis, int64_t index) {
    return m.op("Gather", "gather", {x, imp.constI64({index}, /*scalar=*/true)}, {m.i64("axis", axis)});
  };
  int64_t scannedSteps = 0;
  bool loopStep = false;
  // A scan longer than --max-unroll: a loop step whose body takes slice t of
  // each scan input (Gather by the iteration number, counted from the end for
  // a reverse direction); the step stacks the output slices along a new first
  // axis, which is then reversed or moved where the node wants it.
  auto scanStep = [&](ArrayRef<Value> st, ArrayRef<Value> xs, ArrayRef<int64_t> axes,
                      int64_t length) -> FailureOr<SmallVector<Value>> {
    LoopStepSpec spec;
    spec.carried.assign(st.begin(), st.end());
    spec.maxTrips = length;
    spec.overflowMessage = "Scan '" + imp.nodeName + "' ran past its length"; // M is the length: never happens
    auto importBody = [&](ArrayRef<Value> args) -> FailureOr<SmallVector<Value>> {
      SmallVector<Value> inputs(args.begin() + 2, args.end());
      for (auto [j, x] : llvm::enumerate(xs)) {
        Value t = args[0];
        if (inDirs[j]) t = m.op("Sub", "sub", {imp.constI64({length - 1}, /*scalar=*/true), t});
        inputs.push_back(m.op("Gather", "gather", {x, t}, {m.i64("axis", axes[j])}));
      }
      if (!m.ok) return failure();
      auto res = importSubgraph(imp, *body, "body", inputs);
      if (failed(res)) return failure();
      SmallVector<Value> outs = {constOf(imp, imp.builder.getI1Type(), 1, 0)};
      outs.append(res->begin(), res->end());
      return outs;
    };
    spec.importBody = importBody; // a function_ref: the lambda must outlive it
    FailureOr<LoopOp> loop = emitLoopStep(imp, spec);
    if (failed(loop)) return failure();
    SmallVector<Value> results(loop->getResults());
    for (int64_t k = 0; k < numScanOut; ++k) {
      Value &y = results[size_t(numState + k)];
      int64_t rank = cast<RankedTensorType>(y.getType()).getRank();
      if (outDirs[size_t(k)]) {
        SmallVector<int64_t> backwards;
        for (int64_t t = length - 1; t >= 0; --t) backwards.push_back(t);
        y = m.op("Gather", "gather", {y, imp.constI64(backwards)}, {m.i64("axis", 0)});
      }
      int64_t axis = outAxes[size_t(k)] < 0 ? outAxes[size_t(k)] + rank : outAxes[size_t(k)];
      if (axis < 0 || axis >= rank) return (void)imp.fail("scan_output_axes[" + std::to_string(k) + "] is out of range"), failure();
      if (axis) {
        SmallVector<int64_t> perm;
        for (int64_t d = 1; d <= axis; ++d) perm.push_back(d);
        perm.push_back(0);
        for (int64_t d = axis + 1; d < rank; ++d) perm.push_back(d);
        y = m.transpose(y, perm);
      }
    }
    if (!m.ok) return failure();
    return results;
  };
  // One scan over unbatched values; returns the final states, then the scan outputs.
  auto scanOnce = [&](SmallVector<Value> st, ArrayRef<Value> xs, const std::string &what) -> FailureOr<SmallVector<Value>> {
    auto bail = [&](const std::string &message) -> FailureOr<SmallVector<Value>> {
      (void)imp.fail(message);
      return failure();
    };
    int64_t length = -1;
    SmallVector<int64_t> axes;
    for (auto [j, x] : llvm::enumerate(xs)) {
      auto type = cast<RankedTensorType>(x.getType());
      int64_t axis = inAxes[j] < 0 ? inAxes[j] + type.getRank() : inAxes[j];
      if (axis < 0 || axis >= type.getRank()) return bail("scan_input_axes[" + std::to_string(j) + "] is out of range");
      int64_t len = type.getDimSize(axis);
      if (ShapedType::isDynamic(len))
        return bail("scan input " + std::to_string(j) + " has a run-time sequence length; give --shapes");
      if (length >= 0 && len != length) return bail("scan inputs differ in sequence length");
      length = len;
      axes.push_back(axis);
    }
    scannedSteps = length;
    if (length == 0 && numScanOut) return bail("scans 0 steps, so its scan outputs would be empty");
    if (length > imp.options->maxUnroll) {
      FailureOr<SmallVector<Value>> r = scanStep(st, xs, axes, length);
      if (succeeded(r)) loopStep = true;
      return r;
    }
    SmallVector<SmallVector<Value>> outs;
    outs.resize(size_t(numScanOut));
    for (int64_t t = 0; t < length; ++t) {
      SmallVector<Value> inputs(st);
      for (auto [j, x] : llvm::enumerate(xs)) inputs.push_back(slice(x, axes[j], inDirs[j] ? length - 1 - t : t));
      if (!m.ok) return failure();
      auto res = importSubgraph(imp, *body, what + "body (step " + std::to_string(t) + ")", inputs);
      if (failed(res)) return failure();
      st.assign(res->begin(), res->begin() + numState);
      for (int64_t k = 0; k < numScanOut; ++k) outs[size_t(k)].push_back((*res)[size_t(numState + k)]);
    }
    SmallVector<Value> results(st);
    for (int64_t k = 0; k < numScanOut; ++k) {
      if (outDirs[size_t(k)]) std::reverse(outs[size_t(k)].begin(), outs[size_t(k)].end());
      results.push_back(stack(m, outs[size_t(k)], outAxes[size_t(k)]));
    }
    if (!m.ok) return failure();
    return results;
  };

  std::string name = imp.nodeName;
  SmallVector<Value> results;
  if (!batched) {
    auto r = scanOnce(states, scanIns, "");
    if (failed(r)) return failure();
    results = *r;
  } else {
    for (int64_t &a : inAxes) a = 0; // Scan-8 scans axis 1 of the batched value: axis 0 of a row
    auto lens = optionalInput(imp, n, 0);
    if (failed(lens)) return failure();
    DenseElementsAttr lensValue = *lens ? knownValue(*lens) : DenseElementsAttr();
    if (*lens && !lensValue) return imp.fail("sequence_lens is run-time data; --bind it");
    auto xt = cast<RankedTensorType>(scanIns[0].getType());
    int64_t batch = xt.getDimSize(0);
    if (ShapedType::isDynamic(batch)) return imp.fail("the batch size is run-time data; give --shapes");
    if (lensValue)
      for (APInt len : lensValue.getValues<APInt>())
        if (len.getSExtValue() != xt.getDimSize(1)) return imp.fail("sequence_lens shorter than the sequence are not supported");
    SmallVector<SmallVector<Value>> perRow;
    for (int64_t b = 0; b < batch; ++b) {
      SmallVector<Value> st, xs;
      for (Value s : states) st.push_back(slice(s, 0, b));
      for (Value x : scanIns) xs.push_back(slice(x, 0, b));
      auto r = scanOnce(st, xs, "batch " + std::to_string(b) + " ");
      if (failed(r)) return failure();
      perRow.push_back(*r);
    }
    for (size_t i = 0; i < perRow[0].size(); ++i) {
      SmallVector<Value> rows;
      for (auto &r : perRow) rows.push_back(r[i]);
      results.push_back(stack(m, rows, 0));
    }
  }
  if (!m.ok) return failure();
  imp.controlFlowNotes.push_back("Scan '" + name + "': " + (loopStep ? "loop step over " : "unrolled ") +
                                 std::to_string(scannedSteps) + " step(s)" + (batched ? " per batch row" : "") +
                                 (loopStep ? " (more than --max-unroll " + std::to_string(imp.options->maxUnroll) + ")"
                                           : ""));
  return bindOutputs(imp, n, results);
}

} // namespace sd
