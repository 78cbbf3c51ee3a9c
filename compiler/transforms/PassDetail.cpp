// Location helpers shared by passes.
#include "PassDetail.h"
#include "OpLibraryBridge.h"
#include "vjp/GradBuilder.h"
#include <cmath>

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

std::optional<double> scalarValue(mlir::Value v) {
  mlir::ElementsAttr c = ir::constantValue(v);
  if (!c || c.getNumElements() != 1) return std::nullopt;
  auto dense = mlir::dyn_cast<mlir::DenseElementsAttr>(c);
  if (!dense || !mlir::isa<mlir::FloatType>(dense.getElementType())) return std::nullopt;
  return (*dense.getValues<llvm::APFloat>().begin()).convertToDouble();
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

} // namespace sd
