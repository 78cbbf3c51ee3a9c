// AdaLoRA's rank allocation in the apply entry (see AdaloraAllocation.h).
#include "AdaloraAllocation.h"
#include "PassDetail.h"
#include "sd/format/training_abi.h"
#include "vjp/GradBuilder.h"
#include <cmath>

using namespace mlir;
using namespace sd::ir;

namespace sd {
namespace {

struct AdaloraSchedule {
  int64_t initBudget = 0, targetBudget = 0, tinit = 0, tfinal = 0, deltaT = 1, total = 0;
  double beta1 = 0.85, beta2 = 0.85;
};

// How many triplets global_step `step` masks: PEFT's budget_schedule (in
// double, as Python computes it) where a mask is due, the target budget's at
// T - tfinal (the forced mask), else 0. Entry T + 1 stands for every later step.
std::vector<int64_t> maskCounts(const AdaloraSchedule &s) {
  std::vector<int64_t> k(size_t(s.total + 2), 0);
  for (int64_t step = 0; step <= s.total; ++step) {
    if (step == s.total - s.tfinal) {
      k[size_t(step)] = s.initBudget - s.targetBudget;
    } else if (step < s.total - s.tfinal && step > s.tinit && step % s.deltaT == 0) {
      double coeff = 1.0 - double(step - s.tinit) / double(s.total - s.tfinal - s.tinit);
      auto budget = int64_t(double(s.initBudget - s.targetBudget) * std::pow(coeff, 3) + double(s.targetBudget));
      k[size_t(step)] = s.initBudget - budget;
    }
  }
  return k;
}

// The update of one adapter tensor in `apply`: its AdamW (or SGD) step.
struct TensorUpdate {
  Operation *update = nullptr;
  GlobalStoreOp store; // of the updated parameter
};

} // namespace

bool trainsAdalora(ModuleOp module) {
  auto peft = module->getAttrOfType<DictionaryAttr>("sd.peft");
  auto type = peft ? peft.getAs<StringAttr>("peft_type") : StringAttr();
  return type && type.getValue() == "ADALORA";
}

LogicalResult appendRankAllocation(ModuleOp module, func::FuncOp apply, Value newStep) {
  auto peft = module->getAttrOfType<DictionaryAttr>("sd.peft");
  auto modules = peft.getAs<ArrayAttr>("modules");
  auto integer = [&](const char *key) {
    auto a = peft.getAs<IntegerAttr>(key);
    return a ? a.getInt() : int64_t(0);
  };
  auto real = [&](const char *key) {
    auto a = peft.getAs<FloatAttr>(key);
    return a ? a.getValueAsDouble() : 0.0;
  };
  AdaloraSchedule s;
  int64_t r = integer("init_r");
  s.initBudget = r * int64_t(modules.size());
  s.targetBudget = integer("target_r") * int64_t(modules.size());
  s.tinit = integer("tinit"), s.tfinal = integer("tfinal"), s.deltaT = integer("deltaT"), s.total = integer("total_step");
  s.beta1 = real("beta1"), s.beta2 = real("beta2");
  if (!modules || modules.empty() || r < 1 || s.total < 1 || s.deltaT < 1)
    return module.emitError("AdaLoRA's configuration (sd.peft) is incomplete");

  // Each adapter tensor's update in the apply entry, by global name.
  llvm::StringMap<TensorUpdate> updates;
  apply.walk([&](Operation *op) {
    if (!isa<AdamWOp, SGDOp>(op)) return;
    if (auto load = op->getOperand(0).getDefiningOp<GlobalLoadOp>()) updates[load.getGlobal()].update = op;
  });
  apply.walk([&](GlobalStoreOp st) {
    auto it = updates.find(st.getGlobal());
    if (it != updates.end() && it->second.update && st.getValue() == it->second.update->getResult(0))
      it->second.store = st;
  });

  OpBuilder b(apply.getBody().front().getTerminator());
  Location loc = NameLoc::get(b.getStringAttr("adalora_allocation"));
  GradBuilder g(b, loc);
  Type f32 = b.getF32Type(), i64 = b.getI64Type();
  auto load = [&](GlobalOp gl) { return b.create<GlobalLoadOp>(loc, gl.getType(), gl.getSymName()).getResult(); };
  // Stores wait until every value is computed: a global's load must not be read after its store (the
  // buffer is written in place).
  SmallVector<std::pair<Value, GlobalOp>> stores;
  auto store = [&](Value v, GlobalOp gl) { stores.push_back({v, gl}); };

  Value step = g.sub(newStep, g.scalar(f32, 1.0)); // PEFT's global_step
  Value boundary = g.scalar(f32, double(s.total - s.tfinal));
  Value phaseA = g.make<LessOp>({step, boundary}), phaseB = g.make<EqualOp>({step, boundary});
  Value phaseC = g.make<GreaterOp>({step, boundary});
  std::vector<int64_t> counts = maskCounts(s);
  auto tableType = RankedTensorType::get({int64_t(counts.size())}, i64);
  Value table = b.create<ConstantOp>(loc, tableType, DenseElementsAttr::get(tableType, ArrayRef<int64_t>(counts)));
  Value at = g.castTo(g.make<MinOp>({step, g.scalar(f32, double(s.total + 1))}), i64);
  Value k = g.make<GatherOp>({table, at}, {g.attr("axis", 0)});

  // The sensitivity of every element, and each triplet's score.
  SmallVector<Value> tripletScores;
  SmallVector<std::pair<Value, TensorUpdate *>> eUpdates;
  for (Attribute m : modules) {
    std::string name = cast<StringAttr>(m).getValue().str();
    Value parts[3]; // A [r, in] -> [r], E [r, 1] -> [r], B [out, r] -> [r]
    for (int t = 0; t < 3; ++t) {
      std::string tensor = name + (t == 0 ? ".lora_A" : t == 1 ? ".lora_E" : ".lora_B");
      auto it = updates.find(tensor);
      auto global = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, tensor));
      if (it == updates.end() || !it->second.store || !global)
        return module.emitError() << "AdaLoRA: no optimizer update of '" << tensor << "'";
      Operation *u = it->second.update;
      // The step's gradient as PEFT's p.grad (mean, clipped), read before the update zeroes it in place.
      Value grad;
      {
        OpBuilder before(u);
        GradBuilder gb(before, loc);
        grad = gb.mul(u->getOperand(1), u->getOperand(isa<AdamWOp>(u) ? 7 : 6));
        if (gb.failed()) return failure();
      }
      Value ipt = g.make<AbsOp>({g.mul(u->getResult(0), grad)});
      auto stateType = global.getType();
      GlobalOp avgIpt = getOrCreateGlobal(module, "adalora.exp_avg_ipt." + tensor, stateType, "optimizer_state");
      GlobalOp avgUnc = getOrCreateGlobal(module, "adalora.exp_avg_unc." + tensor, stateType, "optimizer_state");
      Value oldIpt = load(avgIpt), oldUnc = load(avgUnc);
      Value newIpt = g.add(g.scale(oldIpt, s.beta1), g.scale(ipt, 1.0 - s.beta1));
      Value newUnc = g.add(g.scale(oldUnc, s.beta2), g.scale(g.make<AbsOp>({g.sub(ipt, newIpt)}), 1.0 - s.beta2));
      Value zeros = g.zeros(stateType);
      store(g.make<WhereOp>({phaseA, newIpt, g.make<WhereOp>({phaseB, zeros, oldIpt})}), avgIpt);
      store(g.make<WhereOp>({phaseA, newUnc, g.make<WhereOp>({phaseB, zeros, oldUnc})}), avgUnc);
      // Scores from the EMAs as they stand when PEFT masks: updated in phase A, not at T - tfinal.
      Value score = g.make<WhereOp>({phaseA, g.mul(newIpt, newUnc), g.mul(oldIpt, oldUnc)});
      parts[t] = t == 1 ? g.reshape(score, {r}) : g.make<ReduceMeanOp>({score, g.ints({t == 0 ? 1 : 0})}, {g.attr("keepdims", 0)});
      if (t == 1) eUpdates.push_back({Value(), &it->second});
    }
    tripletScores.push_back(g.add(parts[1], g.add(parts[0], parts[2])));
    eUpdates.back().first = tripletScores.back();
  }
  int64_t n = s.initBudget;
  Value all = tripletScores.size() == 1 ? tripletScores[0]
                                        : g.make<ConcatOp>(ValueRange(tripletScores), {g.attr("axis", 0)});
  Value ascending = g.make<TopKOp>({all, g.ints({1}, {n})}, {g.attr("axis", 0), g.attr("largest", 0), g.attr("sorted", 1)});
  Value one = g.ints({}, {1}), zero = g.ints({}, {0});
  Value threshold = g.make<GatherOp>({ascending, g.make<MaxOp>(ValueRange{g.sub(k, one), zero})}, {g.attr("axis", 0)});
  Value masking = g.make<GreaterOp>({k, zero});

  for (auto [score, e] : eUpdates) {
    std::string tensor = e->store.getGlobal().str();
    Value below = g.make<AndOp>({masking, g.make<LessOrEqualOp>({score, threshold})}); // [r]
    GlobalOp pruned = getOrCreateGlobal(module, "adalora.pruned." + tensor, RankedTensorType::get({r}, f32),
                                        "optimizer_state");
    Value prunedNow = load(pruned);
    Value wasPruned = g.make<GreaterOp>({prunedNow, g.scalar(f32, 0.0)});
    store(g.make<WhereOp>({phaseB, g.castTo(below, f32), prunedNow}), pruned);
    Value drop = g.reshape(g.make<OrOp>({below, g.make<AndOp>({phaseC, wasPruned})}), {r, 1});
    Value updated = e->store.getValue();
    auto type = cast<RankedTensorType>(updated.getType());
    e->store.erase();
    store(g.make<WhereOp>({drop, g.zeros(type), updated}), cast<GlobalOp>(SymbolTable::lookupSymbolIn(module, tensor)));
  }
  if (g.failed()) return failure();
  for (auto [v, gl] : stores) b.create<GlobalStoreOp>(loc, gl.getSymName(), v);
  return success();
}

} // namespace sd
