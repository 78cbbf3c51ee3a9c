// sd-fuse-projections: linear layers that read the same input with frozen
// weights (attention's q/k/v projections, an MLP's gate and up) become one
// linear over the weights concatenated at compile time, then a Split. A
// decode step's matrix-vector products are bound by handing work to the
// threads and streaming weights; one product instead of three saves two
// hand-offs per layer, and training's dX becomes one GEMM. A weight joins
// only when every use of it, in every entry, is such a group with the same
// members: the concatenated copy replaces it, never doubles it.
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include <array>
#include <map>
#include <set>

namespace sd {
#define GEN_PASS_DEF_FUSEPROJECTIONS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// A frozen f32 2-D (weight) or 1-D (bias) global with its data at hand (not
// a splat: those stay as they are).
GlobalOp frozenGlobal(const SymbolTable &globals, Value v, int64_t rank) {
  auto load = v.getDefiningOp<GlobalLoadOp>();
  if (!load) return {};
  auto g = globals.lookup<GlobalOp>(load.getGlobal());
  auto t = g ? dyn_cast<RankedTensorType>(g.getType()) : RankedTensorType();
  if (!g || !sd::hasFrozenValue(g) || !t || t.getRank() != rank || !t.getElementType().isF32() ||
      !t.hasStaticShape() || int64_t(sd::floatsOf(g).size()) != t.getNumElements())
    return {};
  return g;
}

struct Group {
  func::FuncOp f;
  SmallVector<LinearOp> members; // in program order
};

// What makes two groups the same fusion: layout, then weight and bias globals in order.
std::string signatureOf(const SymbolTable &globals, ArrayRef<LinearOp> members) {
  std::string s = LinearOp(members.front()).getLayout().str();
  for (LinearOp l : members) {
    s += "|" + frozenGlobal(globals, l.getWeight(), 2).getSymName().str();
    if (GlobalOp b = frozenGlobal(globals, l.getBias(), 1)) s += "+" + b.getSymName().str();
  }
  return s;
}

struct FuseProjectionsPass : sd::impl::FuseProjectionsBase<FuseProjectionsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable globals(module); // the original globals; the fused ones are added behind its back
    std::vector<Group> groups;
    for (func::FuncOp f : module.getOps<func::FuncOp>()) collect(globals, f, groups);
    // Every use of each candidate global, and the signatures it appears in.
    std::map<std::string, int64_t> uses, groupedUses;
    std::map<std::string, std::set<std::string>> signatures;
    module.walk([&](GlobalLoadOp load) {
      uses[load.getGlobal().str()] += std::distance(load->use_begin(), load->use_end());
    });
    std::vector<std::string> sigs;
    for (Group &g : groups) {
      sigs.push_back(signatureOf(globals, g.members));
      for (LinearOp l : g.members)
        for (Value v : std::array<Value, 2>{l.getWeight(), l.getBias()})
          if (auto load = v.getDefiningOp<GlobalLoadOp>()) {
            ++groupedUses[load.getGlobal().str()];
            signatures[load.getGlobal().str()].insert(sigs.back());
          }
    }
    std::map<std::string, std::pair<GlobalOp, GlobalOp>> fused; // signature -> concatenated weight and bias, made once
    for (size_t i = 0; i < groups.size(); ++i) {
      bool ok = true;
      for (LinearOp l : groups[i].members)
        for (Value v : std::array<Value, 2>{l.getWeight(), l.getBias()})
          if (auto load = v.getDefiningOp<GlobalLoadOp>()) {
            std::string name = load.getGlobal().str();
            ok &= uses[name] == groupedUses[name] && signatures[name].size() == 1;
          }
      if (!ok) continue;
      bool made = fused.count(sigs[i]);
      auto &[weight, bias] = fused[sigs[i]];
      if (!made && failed(concatenate(module, globals, groups[i].members, weight, bias))) return signalPassFailure();
      if (failed(rewrite(groups[i].members, weight, bias))) return signalPassFailure();
    }
    // The members' globals are unused now.
    for (GlobalOp g : llvm::make_early_inc_range(module.getOps<GlobalOp>()))
      if (groupedUses.count(g.getSymName().str()) && SymbolTable::symbolKnownUseEmpty(g, module)) g.erase();
  }

  // Groups of two or more linears on one input, each with a frozen weight
  // and either all without bias or all with a frozen one.
  static void collect(const SymbolTable &globals, func::FuncOp f, std::vector<Group> &out) {
    llvm::MapVector<Value, SmallVector<LinearOp>> byInput;
    f.walk([&](LinearOp l) {
      bool hasBias = !isa<NoneType>(l.getBias().getType());
      if (frozenGlobal(globals, l.getWeight(), 2) && (!hasBias || frozenGlobal(globals, l.getBias(), 1)))
        byInput[l.getInput()].push_back(l);
    });
    for (auto &[input, linears] : byInput) {
      // One layout and one bias kind per group (the first member's).
      SmallVector<LinearOp> members;
      bool biased = !isa<NoneType>(linears.front().getBias().getType());
      for (LinearOp l : linears)
        if (l.getLayout() == linears.front().getLayout() && biased == !isa<NoneType>(l.getBias().getType()))
          members.push_back(l);
      if (members.size() >= 2) out.push_back({f, members});
    }
  }

  // The members' weights side by side along the output axis ([in, sum out]
  // for "io", [sum out, in] for "oi"), and their biases.
  static LogicalResult concatenate(ModuleOp module, const SymbolTable &globals, ArrayRef<LinearOp> members,
                                   GlobalOp &weight, GlobalOp &bias) {
    bool io = LinearOp(members.front()).getLayout() == "io";
    std::vector<ArrayRef<float>> parts, biasParts;
    std::vector<int64_t> outs;
    int64_t in = -1, total = 0;
    std::string name = "fused:";
    for (LinearOp l : members) {
      GlobalOp g = frozenGlobal(globals, l.getWeight(), 2);
      auto t = cast<RankedTensorType>(g.getType());
      int64_t rows = t.getDimSize(0), cols = t.getDimSize(1), out = io ? cols : rows;
      if (in >= 0 && in != (io ? rows : cols)) return l.emitError("fused projections disagree on the input size");
      in = io ? rows : cols;
      parts.push_back(sd::floatsOf(g));
      if (int64_t(parts.back().size()) != rows * cols) return l.emitError("cannot read the weights of ") << g.getSymName();
      if (GlobalOp b = frozenGlobal(globals, l.getBias(), 1)) {
        biasParts.push_back(sd::floatsOf(b));
        if (int64_t(biasParts.back().size()) != out) return l.emitError("cannot read the bias of ") << l.getModule();
      }
      outs.push_back(out);
      total += out;
      name += (name.size() > 6 ? "+" : "") + l.getModule().str();
    }
    std::vector<float> data;
    data.reserve(size_t(in * total));
    if (io) {
      for (int64_t r = 0; r < in; ++r)
        for (size_t m = 0; m < parts.size(); ++m)
          data.insert(data.end(), parts[m].begin() + r * outs[m], parts[m].begin() + (r + 1) * outs[m]);
    } else {
      for (ArrayRef<float> p : parts) data.insert(data.end(), p.begin(), p.end());
    }
    weight = sd::createFloatGlobal(module, name + ".weight",
                                   io ? ArrayRef<int64_t>{in, total} : ArrayRef<int64_t>{total, in}, "frozen", &data);
    if (!biasParts.empty()) {
      std::vector<float> b;
      for (ArrayRef<float> p : biasParts) b.insert(b.end(), p.begin(), p.end());
      bias = sd::createFloatGlobal(module, name + ".bias", {total}, "frozen", &b);
    }
    return success();
  }

  // One linear at the first member, split back into the members' outputs.
  static LogicalResult rewrite(ArrayRef<LinearOp> members, GlobalOp weight, GlobalOp bias) {
    LinearOp first = LinearOp(members.front());
    OpBuilder b(first);
    GradBuilder g(b, first.getLoc());
    Value w = b.create<GlobalLoadOp>(first.getLoc(), weight.getType(), weight.getSymName());
    Value bv = bias ? Value(b.create<GlobalLoadOp>(first.getLoc(), bias.getType(), bias.getSymName())) : g.none();
    std::string module;
    SmallVector<int64_t> sizes;
    for (LinearOp l : members) {
      module += (module.empty() ? "" : "+") + l.getModule().str();
      sizes.push_back(cast<RankedTensorType>(l.getOutput().getType()).getShape().back());
    }
    Value out = g.make<LinearOp>({first.getInput(), w, bv}, {b.getNamedAttr("layout", first.getLayoutAttr()),
                                                             b.getNamedAttr("module", b.getStringAttr(module))});
    if (!out) return first.emitError("cannot fuse the projections of ") << module;
    int64_t rank = cast<RankedTensorType>(out.getType()).getRank();
    Operation *split = g.op<SplitOp>({out, g.ints(sizes)}, {g.attr("axis", rank - 1)}, unsigned(members.size()));
    if (!split) return first.emitError("cannot split the fused projections of ") << module;
    for (size_t i = 0; i < members.size(); ++i) {
      LinearOp l = LinearOp(members[i]);
      if (split->getResult(unsigned(i)).getType() != l.getOutput().getType())
        return l.emitError("the fused projection's part has type ") << split->getResult(unsigned(i)).getType();
      l.getOutput().replaceAllUsesWith(split->getResult(unsigned(i)));
    }
    for (LinearOp l : members) {
      SmallVector<Operation *> loads;
      for (Value v : std::array<Value, 2>{l.getWeight(), l.getBias()})
        if (Operation *d = v.getDefiningOp()) loads.push_back(d);
      l.erase();
      for (Operation *d : loads)
        if (d->use_empty()) d->erase();
    }
    return success();
  }
};

} // namespace
