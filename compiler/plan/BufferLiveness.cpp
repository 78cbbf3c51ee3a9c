// Buffer live ranges over the step order. Entry inputs are live from step 0,
// outputs until the end. A loop body's inputs stay live to the end too: its
// loop step writes the outer-scope values once and runs the body many times.
#include "BufferLiveness.h"

using namespace mlir;

namespace sd {

ir::BufferOp rootBuffer(Value v) {
  while (v) {
    if (auto view = v.getDefiningOp<ir::ViewOp>()) v = view.getSource();
    else return v.getDefiningOp<ir::BufferOp>();
  }
  return {};
}

void BufferLiveness::compute(func::FuncOp f) {
  ranges.clear();
  steps.clear();
  f.walk([&](ir::StepOp s) { steps.push_back(s); });
  numSteps = int64_t(steps.size());
  auto touch = [&](Value v, int64_t at, bool def) {
    ir::BufferOp root = rootBuffer(v);
    if (!root) return;
    auto [it, inserted] = ranges.try_emplace(root, LiveRange{at, at});
    if (!inserted) {
      it->second.first = std::min(it->second.first, at);
      it->second.last = std::max(it->second.last, at);
    }
  };
  const int64_t inputsUntil = f->hasAttr("sd.body") ? std::max<int64_t>(numSteps, 1) : 0;
  f.walk([&](ir::BufferOp b) {
    if (b.getInput()) ranges[b] = LiveRange{0, inputsUntil};
  });
  for (auto [i, s] : llvm::enumerate(steps)) {
    for (Value v : s.getInputs()) touch(v, int64_t(i), false);
    for (Value v : s.getOutputs()) touch(v, int64_t(i), true);
  }
  f.walk([&](ir::OutputOp o) {
    touch(o.getBuffer(), std::max<int64_t>(numSteps, 1), false);
    if (o.getExtent()) touch(o.getExtent(), std::max<int64_t>(numSteps, 1), false);
  });
  // A buffer nothing touches (an unused input) still needs a slot.
  f.walk([&](ir::BufferOp b) { ranges.try_emplace(b, LiveRange{0, 0}); });
}

} // namespace sd
