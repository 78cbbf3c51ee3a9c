// sd-osft-project: keeps OSFT's trainable low factors orthogonal to the
// frozen high subspaces. In each optimizer step (apply, train_step), after
// the cross-rank reduction and before clipping and the update, the gradients
// of U_low and V_low lose their high components,
//   dU_low -= U_high (U_high^T dU_low),   dV_low -= (dV_low V_high^T) V_high,
// and after the update (and after a sharded update's broadcast) the same
// two projections are applied to U_low and V_low themselves, because AdamW's
// element-wise rescaling moves an update out of the subspace. Both run in
// factored form: one sd.osft_coefficients step computes every target's
// coefficients into one buffer (what ranks holding shards would complete
// with one collective), then one sd.osft_deflate step removes them from
// every factor, in place.
//
// Under --shard params the factors hold rows split over the ranks. The U
// side contracts over the rows (U_high^T dU_low): each rank's product is a
// partial sum. The V side contracts over columns (dV_low V_high^T): each rank
// computes its rows of dV_low against all of V_high, gathered first, and
// places them at their rows of the block. One AllReduce of the whole buffer
// then completes both. Summing per-rank products of local rows of V_high
// instead would be wrong (v-rule=allreduce keeps that rule for the test
// that must catch it).
#include "PassDetail.h"
#include "Passes.h"
#include "sd/format/training_abi.h"
#include "vjp/GradBuilder.h"
#include "llvm/ADT/StringSet.h"

namespace sd {
#define GEN_PASS_DEF_OSFTPROJECT
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// A factor kept out of a subspace: the global and the subspace's global.
struct Constrained {
  std::string factor, high;
  int64_t side; // 0: U (rows span the subspace), 1: V
};

struct OsftProjectPass : sd::impl::OsftProjectBase<OsftProjectPass> {
  using OsftProjectBase::OsftProjectBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto dict = module->getAttrOfType<DictionaryAttr>("sd.peft");
    auto type = dict ? dict.getAs<StringAttr>("peft_type") : StringAttr();
    if (!type || type.getValue() != "OSF") return;
    if (auto rows = module->getAttrOfType<ArrayAttr>("sd.row_sharded"))
      for (Attribute n : rows) rowSharded.insert(cast<StringAttr>(n).getValue());
    if (vRule != "gather" && vRule != "allreduce") {
      module.emitError() << "v-rule is gather or allreduce, got '" << vRule << "'";
      return signalPassFailure();
    }
    std::vector<Constrained> targets;
    for (Attribute a : dict.getAs<ArrayAttr>("modules")) {
      std::string m = cast<StringAttr>(a).str();
      targets.push_back({m + ".osf_svd_params.U_low", m + ".osf_U_high", 0});
      targets.push_back({m + ".osf_svd_params.V_low", m + ".osf_V_high", 1});
    }
    for (auto f : module.getOps<func::FuncOp>()) {
      SmallVector<GradScaleOp> scales;
      f.walk([&](GradScaleOp op) { scales.push_back(op); });
      for (GradScaleOp scale : scales) {
        if (scale->hasAttr("sharded_grads") && rowSharded.empty()) { // --shard grads
          scale.emitError("OSFT with --shard grads is not supported yet: the projection needs each whole gradient "
                          "on every rank (use --shard none, optimizer or params)");
          return signalPassFailure();
        }
        if (failed(projectGradients(module, scale, targets))) return signalPassFailure();
        OpBuilder b(f.getBody().front().getTerminator());
        if (failed(projectParameters(module, b, targets))) return signalPassFailure();
      }
    }
  }

  llvm::StringSet<> rowSharded; // --shard params (sd-shard-params)

  GlobalOp global(ModuleOp module, StringRef name) {
    return dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, name));
  }

  // Projects the current values of `names` (each constrained by of[i]) and
  // stores them back; with `reload`, returns new loads of the stored values.
  FailureOr<SmallVector<Value>> project(ModuleOp module, OpBuilder &b, ArrayRef<std::string> names,
                                        ArrayRef<const Constrained *> of, bool reload) {
    Location loc = NameLoc::get(b.getStringAttr("osft_project"));
    GradBuilder g(b, loc);
    SmallVector<Value> operands, values;
    SmallVector<int64_t> sides, xRows, highRows;
    bool sharded = false;
    for (auto [name, t] : llvm::zip(names, of)) {
      GlobalOp x = global(module, name), h = global(module, t->high);
      if (!x || !h) return failure();
      if (rowSharded.contains(name) != rowSharded.contains(t->high))
        return emitError(loc) << "'" << name << "' and '" << t->high << "' must be row-sharded alike";
      sharded |= rowSharded.contains(name);
      values.push_back(b.create<GlobalLoadOp>(loc, x.getType(), x.getSymName()));
      Value high = b.create<GlobalLoadOp>(loc, h.getType(), h.getSymName());
      // Rows sharded: U_high shares the rows of U_low and dU_low (the
      // contraction runs over them; an all-reduce completes it), but a V
      // pair contracts over columns, so each rank needs every row of V_high.
      // v-rule=allreduce keeps the local rows instead, the known-wrong rule
      // (sdc --osft-v-rule, test only): the products of one rank's rows of
      // x with another rank's rows of V_high are then never formed.
      if (rowSharded.contains(t->high) && t->side == 1 && vRule == "gather")
        high = b.create<AllGatherRowsOp>(loc, TypeRange{high.getType()}, ValueRange{high}).getResult();
      operands.append({values.back(), high});
      sides.push_back(t->side);
      xRows.push_back(cast<RankedTensorType>(x.getType()).getDimSize(0));
      highRows.push_back(cast<RankedTensorType>(h.getType()).getDimSize(0));
    }
    SmallVector<NamedAttribute> attrs = {g.attr("sides", ArrayRef<int64_t>(sides))};
    if (sharded)
      attrs.append({g.attr("row_sharded", int64_t(1)), g.attr("x_rows", ArrayRef<int64_t>(xRows)),
                    g.attr("high_rows", ArrayRef<int64_t>(highRows))});
    Value coefficients = g.make<OsftCoefficientsOp>(operands, attrs);
    // Every target's coefficients complete in one collective.
    if (sharded && coefficients)
      coefficients = b.create<AllReduceOp>(loc, TypeRange{coefficients.getType()}, ValueRange{coefficients}).getResult(0);
    SmallVector<Value> reloaded, deflateOperands = {coefficients};
    deflateOperands.append(operands);
    Operation *deflate = g.op<OsftDeflateOp>(deflateOperands, attrs, unsigned(names.size()));
    if (!deflate) return failure();
    for (size_t i = 0; i < names.size(); ++i) b.create<GlobalStoreOp>(loc, names[i], deflate->getResult(i));
    for (size_t i = 0; reload && i < names.size(); ++i)
      reloaded.push_back(b.create<GlobalLoadOp>(loc, values[i].getType(), names[i]));
    if (g.failed()) return failure();
    return reloaded;
  }

  LogicalResult projectGradients(ModuleOp module, GradScaleOp scale, const std::vector<Constrained> &targets) {
    SmallVector<std::string> names;
    SmallVector<const Constrained *> of;
    SmallVector<GlobalLoadOp> loads;
    for (Value v : scale.getGrads()) {
      auto load = v.getDefiningOp<GlobalLoadOp>();
      if (!load) continue;
      for (const Constrained &t : targets)
        if (load.getGlobal() == sd::abi::gradientOf(t.factor)) {
          names.push_back(load.getGlobal().str());
          of.push_back(&t);
          loads.push_back(load);
        }
    }
    if (names.empty()) return success();
    OpBuilder b(scale);
    auto projected = project(module, b, names, of, /*reload=*/true);
    if (failed(projected)) return scale.emitError("cannot build the OSFT gradient projection");
    for (auto [old, now] : llvm::zip(loads, *projected))
      old.getResult().replaceUsesWithIf(now, [&](OpOperand &use) {
        return use.getOwner()->isBeforeInBlock(now.getDefiningOp()) == false;
      });
    return success();
  }

  LogicalResult projectParameters(ModuleOp module, OpBuilder &b, const std::vector<Constrained> &targets) {
    SmallVector<std::string> names;
    SmallVector<const Constrained *> of;
    for (const Constrained &t : targets)
      if (GlobalOp p = global(module, t.factor); p && p.getRole() == "trainable") {
        names.push_back(t.factor);
        of.push_back(&t);
      }
    if (names.empty()) return success();
    if (failed(project(module, b, names, of, /*reload=*/false)))
      return module.emitError("cannot build the OSFT parameter re-projection");
    return success();
  }
};

} // namespace
