// Location helpers shared by passes.
#include "PassDetail.h"
#include "OpLibraryBridge.h"
#include "vjp/GradBuilder.h"
#include <cmath>
#include <set>
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace sd {

std::string nodeNameOf(mlir::Location loc) {
  if (auto n = mlir::dyn_cast<mlir::NameLoc>(loc)) return n.getName().str();
  if (auto f = mlir::dyn_cast<mlir::FusedLoc>(loc))
    for (mlir::Location l : f.getLocations())
      if (auto s = nodeNameOf(l); !s.empty()) return s;
  return "";
}

std::string moduleScopeOf(mlir::Location loc) {
  if (auto f = mlir::dyn_cast<mlir::FusedLoc>(loc)) {
    if (auto s = mlir::dyn_cast_or_null<mlir::StringAttr>(f.getMetadata())) return s.str();
    for (mlir::Location l : f.getLocations())
      if (auto s = moduleScopeOf(l); !s.empty()) return s;
  }
  return "";
}

bool isElementwiseContract(llvm::StringRef c) {
  static const llvm::StringSet<> ops = {
      "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos",
      "Tanh", "Erf", "Sigmoid", "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Gelu", "HardSigmoid",
      "HardSwish", "Softplus", "Softsign", "Mish", "Floor", "Ceil", "Round", "Sign", "Clip", "Where",
      "Max", "Min", "Sum", "Mean", "ThresholdedRelu", "PRelu", "Cast", "Not", "And", "Or", "Xor", "Equal",
      "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Mod", "IsNaN", "IsInf", "BitShift", "FusedElementwise"};
  return ops.contains(c);
}

std::string describeNode(mlir::Operation *op) {
  std::string name = nodeNameOf(op->getLoc());
  std::string kind = op->getName().getStringRef().str();
  if (auto c = mlir::dyn_cast<sd::ir::ComputeOpInterface>(op)) kind = c.getContractName().str();
  return name.empty() ? kind : "node '" + name + "' (" + kind + ")";
}

} // namespace sd

namespace sd {

bool fullMatchRegex(const std::string &pattern, std::unique_ptr<llvm::Regex> &out, std::string &error) {
  std::string ere = "^(";
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      char c = pattern[i + 1];
      const char *cls = c == 'd' ? "[0-9]" : c == 'w' ? "[A-Za-z0-9_]" : c == 's' ? "[[:space:]]" : nullptr;
      if (cls) {
        ere += cls;
        ++i;
        continue;
      }
      ere += pattern[i];
      ere += c;
      ++i;
      continue;
    }
    ere += pattern[i];
  }
  ere += ")$";
  out = std::make_unique<llvm::Regex>(ere);
  std::string why;
  if (!out->isValid(why)) {
    error = "'" + pattern + "' is not a valid regular expression: " + why;
    return false;
  }
  return true;
}

} // namespace sd

namespace sd {

ir::GlobalOp getOrCreateGlobal(mlir::ModuleOp module, llvm::StringRef name, mlir::Type type, llvm::StringRef role,
                               mlir::ElementsAttr init) {
  if (auto g = mlir::dyn_cast_or_null<ir::GlobalOp>(mlir::SymbolTable::lookupSymbolIn(module, name))) return g;
  mlir::OpBuilder b(module.getContext());
  ir::GlobalOp last;
  for (ir::GlobalOp g : module.getOps<ir::GlobalOp>()) last = g;
  if (last) b.setInsertionPointAfter(last);
  else b.setInsertionPointToStart(module.getBody());
  return b.create<ir::GlobalOp>(module.getLoc(), b.getStringAttr(name), mlir::TypeAttr::get(type),
                                b.getStringAttr(role), init);
}

} // namespace sd

namespace sd {

mlir::Value widenedHalf(mlir::Value v) {
  auto c = v.getDefiningOp<ir::CastOp>();
  if (!c || !ir::elementTypeOf(v).isF32()) return {};
  mlir::Type from = ir::elementTypeOf(c.getInput());
  return from.isBF16() || from.isF16() ? c.getInput() : mlir::Value();
}

std::optional<double> scalarValue(mlir::Value v) {
  mlir::ElementsAttr c = ir::constantValue(v);
  if (!c || c.getNumElements() != 1) return std::nullopt;
  auto dense = mlir::dyn_cast<mlir::DenseElementsAttr>(c);
  if (!dense || !mlir::isa<mlir::FloatType>(dense.getElementType())) return std::nullopt;
  return (*dense.getValues<llvm::APFloat>().begin()).convertToDouble();
}

ir::MulOp scalarFactor(mlir::Value v, mlir::Value &rest, double &scale) {
  auto mul = v.getDefiningOp<ir::MulOp>();
  if (!mul || !mul->hasOneUse()) return {};
  mlir::Value other = mul.getLhs();
  std::optional<double> c = scalarValue(mul.getRhs());
  if (!c) c = scalarValue(mul.getLhs()), other = mul.getRhs();
  if (!c || *c == 0 || other.getType() != v.getType()) return {};
  rest = other;
  scale *= *c;
  return mul;
}

bool isLastAxisMean(ir::ReduceMeanOp m) {
  auto t = mlir::dyn_cast<mlir::RankedTensorType>(m.getData().getType());
  llvm::SmallVector<int64_t> axes;
  if (!t || !ir::constantInts(m.getAxes(), axes) || axes.size() != 1) return false;
  return (axes[0] == -1 || axes[0] == t.getRank() - 1) && m.getKeepdims().value_or(1) == 1;
}

bool isScalar(mlir::Value v, double want) {
  std::optional<double> got = scalarValue(v);
  return got && std::abs(*got - want) < 1e-5 * std::max(1.0, std::abs(want));
}

mlir::Value otherOperand(mlir::Operation *op, mlir::Value v) {
  if (op->getNumOperands() != 2) return {};
  if (op->getOperand(0) == v) return op->getOperand(1);
  if (op->getOperand(1) == v) return op->getOperand(0);
  return {};
}

mlir::Operation *soleUser(mlir::Value v) { return v.hasOneUse() ? *v.getUsers().begin() : nullptr; }

mlir::Operation *soleUserThroughCasts(mlir::Value v, mlir::Value &out) {
  out = v;
  mlir::Operation *u = soleUser(v);
  while (auto c = llvm::dyn_cast_or_null<ir::CastOp>(u)) {
    if (c.getOutput().getType() != out.getType()) return nullptr;
    out = c.getOutput();
    u = soleUser(out);
  }
  return u;
}

// Whether `v` reaches an entry's return through shape-only ops (the logits
// of an output head, maybe reshaped).
static bool returnedByEntry(mlir::Value v) {
  for (mlir::Operation *u : v.getUsers()) {
    if (llvm::isa<mlir::func::ReturnOp>(u)) return true;
    if (llvm::isa<ir::ReshapeOp, ir::TransposeOp, ir::FlattenOp, ir::SqueezeOp, ir::UnsqueezeOp>(u) &&
        returnedByEntry(u->getResult(0)))
      return true;
  }
  return false;
}

mlir::LogicalResult selectTargetLinears(mlir::ModuleOp module, const std::string &spec, llvm::StringRef flag,
                                        llvm::SmallVectorImpl<ir::LinearOp> &out) {
  llvm::StringRef text(spec);
  bool allLinear = text.trim() == "all-linear";
  bool isRegex = !allLinear && text.find_first_of("*+?[](){}|^$\\") != llvm::StringRef::npos;
  std::unique_ptr<llvm::Regex> re;
  std::vector<std::string> list;
  if (isRegex) {
    std::string err;
    if (!fullMatchRegex(spec, re, err)) return module.emitError() << flag << " " << err;
  } else if (!allLinear) {
    llvm::SmallVector<llvm::StringRef> parts;
    text.split(parts, ',', -1, false);
    for (llvm::StringRef p : parts)
      if (!p.trim().empty()) list.push_back(p.trim().str());
  }
  std::set<std::string> all;
  module.walk([&](ir::LinearOp l) {
    llvm::StringRef m = l.getModule();
    all.insert(m.str());
    bool hit = false;
    if (allLinear) hit = !returnedByEntry(l.getOutput());
    else if (re) hit = re->match(m);
    else
      for (const std::string &t : list) hit = hit || m == t || m.ends_with("." + t);
    if (hit) out.push_back(l);
  });
  if (!allLinear && !re && list.empty())
    return module.emitError() << flag << " needs module names (modules: " << llvm::join(all, ", ") << ")";
  if (out.empty())
    return module.emitError() << flag << " '" << spec << "' matches no linear module (modules: " << llvm::join(all, ", ")
                              << ")";
  return mlir::success();
}

bool storedInOut(ir::LinearOp l) {
  auto load = l.getWeight().getDefiningOp<ir::GlobalLoadOp>();
  return l.getLayout() == "io" && load && load.getGlobal() == l.getModule().str() + ".weight";
}

std::pair<int64_t, int64_t> linearInOut(ir::LinearOp l) {
  auto wt = mlir::cast<mlir::RankedTensorType>(l.getWeight().getType());
  bool oi = l.getLayout() == "oi";
  return {wt.getDimSize(oi ? 1 : 0), wt.getDimSize(oi ? 0 : 1)};
}

mlir::LogicalResult adapterTargets(mlir::ModuleOp module, const std::string &targetModules,
                                   llvm::SmallVectorImpl<ir::LinearOp> &out) {
  if (mlir::failed(selectTargetLinears(module, targetModules, "--target-modules", out))) return mlir::failure();
  for (ir::GlobalOp g : module.getOps<ir::GlobalOp>())
    if (g.getRole() == "trainable") g.setRole("frozen");
  return mlir::success();
}

VirtualIds virtualIdsAmong(ir::GradBuilder &g, mlir::Value ids, int64_t first) {
  mlir::Type id = mlir::cast<mlir::RankedTensorType>(ids.getType()).getElementType();
  mlir::Value start = g.scalar(id, double(first));
  return {g.make<ir::GreaterOrEqualOp>({ids, start}), g.make<ir::MaxOp>({g.sub(ids, start), g.scalar(id, 0.0)})};
}

llvm::SmallVector<mlir::OpOperand *> usesOf(mlir::Value v) {
  llvm::SmallVector<mlir::OpOperand *> uses;
  for (mlir::OpOperand &u : v.getUses()) uses.push_back(&u);
  return uses;
}

mlir::Value adapterLinear(ir::GradBuilder &g, mlir::Value x, mlir::Value w, llvm::StringRef layout,
                          llvm::StringRef module) {
  mlir::OpBuilder &b = g.builder();
  return g.make<ir::LinearOp>({x, w, g.none()}, {b.getNamedAttr("layout", b.getStringAttr(layout)),
                                                 b.getNamedAttr("module", b.getStringAttr(module))});
}

mlir::Value loadRandomState(mlir::ModuleOp module, mlir::OpBuilder &b, mlir::Location loc) {
  ir::GlobalOp state = getOrCreateGlobal(module, abi::kDropoutRng,
                                         mlir::RankedTensorType::get({abi::kDropoutRngSize}, b.getI64Type()), "scalar_state");
  return b.create<ir::GlobalLoadOp>(loc, state.getType(), state.getSymName());
}

void eraseIfUnread(mlir::Value v) {
  llvm::SmallVector<mlir::Operation *> work;
  if (mlir::Operation *op = v.getDefiningOp()) work.push_back(op);
  while (!work.empty()) {
    mlir::Operation *op = work.pop_back_val();
    // A global load with no reader is dead too (it only reads).
    if (!op->use_empty() || !(mlir::isOpTriviallyDead(op) || mlir::isa<ir::GlobalLoadOp>(op))) continue;
    llvm::SmallVector<mlir::Value> operands(op->getOperands());
    op->erase();
    for (mlir::Value o : operands)
      if (mlir::Operation *def = o.getDefiningOp(); def && !llvm::is_contained(work, def)) work.push_back(def);
  }
}

mlir::Value dyloraBlock(ir::GradBuilder &g, mlir::Value draw, int64_t blocks) {
  mlir::Type f32 = g.builder().getF32Type();
  return g.make<ir::MinOp>({g.make<ir::FloorOp>({draw}), g.scalar(f32, double(blocks - 1))});
}

mlir::Value adapterDropout(mlir::ModuleOp module, ir::GradBuilder &g, mlir::Value x, double ratio, int64_t stream) {
  mlir::OpBuilder &b = g.builder();
  mlir::Value rngState = loadRandomState(module, b, g.loc());
  return g.make<ir::SeededDropoutOp>({x, rngState}, {b.getNamedAttr("ratio", b.getF32FloatAttr(float(ratio))),
                                                     g.attr("stream", stream)});
}

} // namespace sd
